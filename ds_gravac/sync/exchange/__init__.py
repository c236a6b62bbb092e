"""Exchange patterns: how a bucket's payload crosses the ranks. The contract is in :mod:`.base`.

The scheduler asks :func:`payload_exchange` which pattern a compressor's payloads use and never looks inside
one. A new family (a two-round low-rank exchange, a parameter-server all-to-all + all-gather, ...) is a new module
here and an entry in :data:`PATTERNS`.
"""
from __future__ import annotations


from ...compress.base import Compressor, Kind
from ...compress.quantize import Quantizer
from ...errors import GravacConfigError
from .allgather import PayloadAllGather
from .allreduce import DenseAllReduce, HalfAllReduce, PayloadAllReduce
from .base import Exchange
from .casync_ps import CaSyncPS
from .chunked import ChunkedExchange, chunk_counts, chunk_spans
from .two_round import TwoRoundAllReduce

PATTERNS: dict[str, type[Exchange]] = {"allreduce": PayloadAllReduce, "allgather": PayloadAllGather,
                            "two_round": TwoRoundAllReduce, "casync_ps": CaSyncPS, "half_allreduce": HalfAllReduce}


def exchange_name(compressor: Compressor, quantized: str = "auto", world_size: int = 0) -> str:
    """The name of a compressor's pattern: its ``exchange``, else by kind. ``quantized`` is the
    ``quantized_exchange`` key: ``"allgather"`` makes quantizers gather every rank's whole-bucket payload (no
    server stage) instead of their parameter-server pattern. ``"auto"`` does the same with two ranks for the
    quantizers whose owners only average and re-round (:func:`owner_only_rerounds`): there both patterns move
    the same bytes per rank, and the all-gather needs one round, one encode and one rounding fewer."""
    name = compressor.exchange or ("allreduce" if compressor.kind == Kind.SUMMABLE else "allgather")
    if compressor.kind == Kind.QUANTIZED and (quantized == "allgather" or (
            quantized == "auto" and world_size == 2 and name == "casync_ps" and owner_only_rerounds(compressor))):
        name = "allgather"
    return name


def owners_average(compressor: Compressor) -> bool:
    """Whether a parameter-server owner averages the decodes (the all-gather computes the same average);
    signSGD's owners vote instead."""
    return isinstance(compressor, Quantizer) and type(compressor).merge_decode is Quantizer.merge_decode


def owner_only_rerounds(compressor: Compressor) -> bool:
    """Owners that average and keep no server residual: their stage adds a second rounding and nothing else."""
    return owners_average(compressor) and not compressor.server_error_feedback


def payload_exchange(compressor: Compressor, quantized: str = "auto", world_size: int = 0) -> type[Exchange]:
    """The pattern class of a compressor's payloads (see :func:`exchange_name`)."""
    name = exchange_name(compressor, quantized, world_size)
    try:
        return PATTERNS[name]
    except KeyError:
        raise GravacConfigError(f"ds_gravac: compressor '{compressor.name}' asks for the exchange pattern "
                                f"'{name}', which this version does not provide (available: "
                                f"{', '.join(sorted(PATTERNS))})") from None


__all__ = ["CaSyncPS", "ChunkedExchange", "DenseAllReduce", "Exchange", "HalfAllReduce", "PATTERNS",
           "PayloadAllGather", "PayloadAllReduce", "TwoRoundAllReduce", "chunk_counts", "chunk_spans",
           "exchange_name", "owner_only_rerounds", "owners_average", "payload_exchange"]
