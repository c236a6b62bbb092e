"""Predicted seconds of one bucket: sent dense, or compressed and exchanged with a given pattern.

Each bucket is priced on its own, from start of staging to its gradients written back, as one chain of
primitives (sent in one piece; chunks below). With ``m`` elements, ``c`` bytes per element of the communication
dtype, ``N`` ranks, the codec's per-call plans (one per member, or one per partition for quantizers) and their
first-round payload of ``P`` bytes:

    dense       stage(m) + all_reduce(c·m) + writeback(m)
    all-reduce  stage(m) + Σ encode + all_reduce(P) + Σ decode + writeback(m)            (summable payloads)
    all-gather  stage(m) + Σ encode + all_gather(P) + N·Σ decode + writeback(m)          (every row decoded)
    CaSync-PS   stage(m) + Σ encode + encode(L) + 2·Σ decode + all_to_all(P) + all_gather(P/N) + writeback(m)

where Σ runs over the codec's calls at their levels, and for the parameter-server pattern the extra terms are
the owner's re-encode of its partition of ``L`` elements, its merge of ``N`` partition payloads and the final
decode of all ``N`` owners' payloads. Overlap with backward or with other buckets is not modelled.

Sent in K pipeline chunks (single-round patterns; chunk j holds whole members, its encode ``e_j`` runs on the CPU
and its collective ``c_j`` on the link, of its ``P_j`` payload bytes), the encodes and collectives form a
two-resource pipeline — each resource serves one chunk at a time, in order — and the decode still follows the
last chunk (the decode target exists only once the step is agreed):

    chunked     stage(m) + pipeline(e, c) + R·Σ decode + writeback(m)      (R = N for the all-gather, else 1)
    pipeline    C_j = C_{j−1} + e_j,  L_j = max(L_{j−1}, C_j) + c_j,  pipeline = L_K

With equal chunks ``pipeline = e_1 + c_1 + (K−1)·max(e_j, c_j)``; with K = 1 the line is the unchunked one.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...compress.base import TensorPlan
from .fits import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, FitTable

SUMMED = ("allreduce", "half_allreduce")
PRICED = SUMMED + ("allgather", "casync_ps")       # patterns this model can price
CHUNKED = SUMMED + ("allgather",)                   # single-round patterns it can price in pipeline chunks


def codec_time(fits: FitTable, kind: str, plans: Sequence[TensorPlan]) -> float:
    """``kind`` ("encode"/"decode") of every plan once, each at its own level."""
    return sum(fits.codec(kind, p.level)(p.numel) for p in plans)


def dense_time(fits: FitTable, numel: int, comm_bytes_per_element: int) -> float:
    return (fits.get(STAGE)(numel) + fits.get(ALL_REDUCE)(comm_bytes_per_element * numel)
        + fits.get(WRITEBACK)(numel))


def pipeline_time(cpu: Sequence[float], link: Sequence[float]) -> float:
    """Makespan of chunks that each take ``cpu[j]`` on the CPU, then ``link[j]`` on the link; each resource
    serves one chunk at a time, in order."""
    done_cpu = done_link = 0.0
    for c, w in zip(cpu, link):
        done_cpu += c
        done_link = max(done_link, done_cpu) + w
    return done_link


def compressed_time(fits: FitTable, exchange: str, numel: int, world_size: int,
                    plans: Sequence[TensorPlan], spans: Optional[Sequence[tuple[int, int]]] = None) -> float:
    """Predicted seconds of the bucket sent with ``exchange`` at the level tuple these ``plans`` realize; with
    ``spans`` (more than one), sent in those pipeline chunks of members."""
    n = world_size
    payload = 4 * sum(p.words for p in plans)
    edges = fits.get(STAGE)(numel) + fits.get(WRITEBACK)(numel)
    enc, dec = codec_time(fits, "encode", plans), codec_time(fits, "decode", plans)
    if spans is not None and len(spans) > 1:
        if exchange not in CHUNKED:
            raise ValueError(f"ds_gravac: the exchange pattern '{exchange}' is not sent in chunks")
        link = fits.get(ALL_REDUCE if exchange in SUMMED else ALL_GATHER)
        cpu = [codec_time(fits, "encode", plans[a:b]) for a, b in spans]
        wire = [link(4 * sum(p.words for p in plans[a:b])) for a, b in spans]
        return edges + pipeline_time(cpu, wire) + (1 if exchange in SUMMED else n) * dec
    if exchange in SUMMED:
        return edges + enc + fits.get(ALL_REDUCE)(payload) + dec
    if exchange == "allgather":
        return edges + enc + fits.get(ALL_GATHER)(payload) + n * dec
    if exchange == "casync_ps":
        part = plans[0]                    # N equal partition plans
        return (edges + enc + codec_time(fits, "encode", [part]) + 2 * dec
            + fits.get(ALL_TO_ALL)(payload) + fits.get(ALL_GATHER)(payload / n))
    raise ValueError(f"ds_gravac: the cost model cannot price the exchange pattern '{exchange}' "
                     f"(priced: {', '.join(PRICED)})")
