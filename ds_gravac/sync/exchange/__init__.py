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
from .allreduce import DenseAllReduce, PayloadAllReduce
from .base import Exchange
from .two_round import TwoRoundAllReduce

PATTERNS: dict[str, Any] = {"allreduce": PayloadAllReduce, "allgather": PayloadAllGather,
                            "two_round": TwoRoundAllReduce}


def payload_exchange(compressor: Compressor) -> Any:
    """The pattern class of a compressor's payloads: its ``exchange`` name, else by kind."""
    name = compressor.exchange or ("allreduce" if compressor.kind == Kind.SUMMABLE else "allgather")
    try:
        return PATTERNS[name]
    except KeyError:
        raise GravacConfigError(f"ds_gravac: compressor '{compressor.name}' asks for the exchange pattern "
                                f"'{name}', which this version does not provide (available: "
                                f"{', '.join(sorted(PATTERNS))})") from None


__all__ = ["DenseAllReduce", "Exchange", "PATTERNS", "PayloadAllGather", "PayloadAllReduce", "TwoRoundAllReduce",
           "payload_exchange"]
