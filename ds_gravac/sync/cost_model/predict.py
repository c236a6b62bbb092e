"""Predicted seconds of one bucket: sent dense, or compressed and exchanged with a given pattern.

Each bucket is priced on its own, from start of staging to its gradients written back, as one chain of
primitives (one pipeline chunk per bucket). With ``m`` elements, ``c`` bytes per element of the communication
dtype, ``N`` ranks, the codec's per-call plans (one per member, or one per partition for quantizers) and their
first-round payload of ``P`` bytes:

    dense       stage(m) + all_reduce(c·m) + writeback(m)
    all-reduce  stage(m) + Σ encode + all_reduce(P) + Σ decode + writeback(m)            (summable payloads)
    all-gather  stage(m) + Σ encode + all_gather(P) + N·Σ decode + writeback(m)          (every row decoded)
    CaSync-PS   stage(m) + Σ encode + encode(L) + 2·Σ decode + all_to_all(P) + all_gather(P/N) + writeback(m)

where Σ runs over the codec's calls at their levels, and for the parameter-server pattern the extra terms are
the owner's re-encode of its partition of ``L`` elements, its merge of ``N`` partition payloads and the final
decode of all ``N`` owners' payloads. Overlap with backward or with other buckets is not modelled.
"""
from __future__ import annotations

from typing import Sequence

from ...compress.base import TensorPlan
from .fits import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, FitTable

SUMMED = ("allreduce", "half_allreduce")
PRICED = SUMMED + ("allgather", "casync_ps")       # patterns this model can price


def codec_time(fits: FitTable, kind: str, plans: Sequence[TensorPlan]) -> float:
    """``kind`` ("encode"/"decode") of every plan once, each at its own level."""
    return sum(fits.codec(kind, p.level)(p.numel) for p in plans)


def dense_time(fits: FitTable, numel: int, comm_bytes_per_element: int) -> float:
    return fits.get(STAGE)(numel) + fits.get(ALL_REDUCE)(comm_bytes_per_element * numel) \
        + fits.get(WRITEBACK)(numel)


def compressed_time(fits: FitTable, exchange: str, numel: int, world_size: int,
                    plans: Sequence[TensorPlan]) -> float:
    """Predicted seconds of the bucket sent with ``exchange`` at the level tuple these ``plans`` realize."""
    n = world_size
    payload = 4 * sum(p.words for p in plans)
    edges = fits.get(STAGE)(numel) + fits.get(WRITEBACK)(numel)
    enc, dec = codec_time(fits, "encode", plans), codec_time(fits, "decode", plans)
    if exchange in SUMMED:
        return edges + enc + fits.get(ALL_REDUCE)(payload) + dec
    if exchange == "allgather":
        return edges + enc + fits.get(ALL_GATHER)(payload) + n * dec
    if exchange == "casync_ps":
        part = plans[0]                    # N equal partition plans
        return edges + enc + codec_time(fits, "encode", [part]) + 2 * dec \
            + fits.get(ALL_TO_ALL)(payload) + fits.get(ALL_GATHER)(payload / n)
    raise ValueError(f"ds_gravac: the cost model cannot price the exchange pattern '{exchange}' "
                     f"(priced: {', '.join(PRICED)})")
