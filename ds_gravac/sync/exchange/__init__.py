"""Exchange patterns: how a bucket's payload crosses the ranks. The contract is in :mod:`.base`.

The scheduler asks :func:`payload_exchange` which pattern a compressor's payloads use and never looks inside
one. A new family (a two-round low-rank exchange, a parameter-server all-to-all + all-gather, ...) is a new module
here and an entry in :data:`PATTERNS`.
"""
from __future__ import annotations

from typing import Any

from ...compress.base import Compressor, Kind
from ...errors import GravacConfigError
from .allgather import PayloadAllGather
from .allreduce import DenseAllReduce, HalfAllReduce, PayloadAllReduce
from .base import Exchange
from .casync_ps import CaSyncPS
from .chunked import ChunkedExchange, chunk_counts, chunk_spans
from .two_round import TwoRoundAllReduce

PATTERNS: dict[str, Any] = {"allreduce": PayloadAllReduce, "allgather": PayloadAllGather,
                            "two_round": TwoRoundAllReduce, "casync_ps": CaSyncPS, "half_allreduce": HalfAllReduce}


def exchange_name(compressor: Compressor, quantized: str = "auto") -> str:
    """The name of a compressor's pattern: its ``exchange``, else by kind. ``quantized`` is the
    ``quantized_exchange`` key: ``"allgather"`` makes quantizers gather every rank's whole-bucket payload (no
    server stage) instead of their parameter-server pattern."""
    name = compressor.exchange or ("allreduce" if compressor.kind == Kind.SUMMABLE else "allgather")
    if compressor.kind == Kind.QUANTIZED and quantized == "allgather":
        name = "allgather"
    return name


def payload_exchange(compressor: Compressor, quantized: str = "auto") -> Any:
    """The pattern class of a compressor's payloads (see :func:`exchange_name`)."""
    name = exchange_name(compressor, quantized)
    try:
        return PATTERNS[name]
    except KeyError:
        raise GravacConfigError(f"ds_gravac: compressor '{compressor.name}' asks for the exchange pattern "
                                f"'{name}', which this version does not provide (available: "
                                f"{', '.join(sorted(PATTERNS))})") from None


__all__ = ["CaSyncPS", "ChunkedExchange", "DenseAllReduce", "Exchange", "HalfAllReduce", "PATTERNS",
           "PayloadAllGather", "PayloadAllReduce", "TwoRoundAllReduce", "chunk_counts", "chunk_spans",
           "exchange_name", "payload_exchange"]
