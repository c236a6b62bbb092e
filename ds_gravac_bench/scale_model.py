"""Step time of a system at N ranks: compute + codec + communication, each bucket priced by the cost model.

The per-bucket lines are the project's own (``ds_gravac.sync.cost_model.predict``): ``dense_time`` for dense
buckets, ``compressed_time`` for the all-reduce, all-gather and CaSync-PS patterns, and for the two-round low-rank
pattern (not priced there) the same chain with two all-reduces:

    two-round   stage(m) + Σ encode + all_reduce(P₁) + all_reduce(P₂) + Σ decode + writeback(m)

(PowerSGD's orthogonalization and projection between the rounds are timed inside its encode). Its fits are:

* collectives at N: the measured line of that N, else the α–β law (``scale_laws``);
* stage, write-back, encode and decode: seconds per element from a reference run's step records (two ranks,
  a core each): ``stage_s``, ``writeback_s`` over every bucket's elements, ``compress_s`` over the compressed
  elements, ``decompress_s`` over the compressed elements times the rows decoded (N for the all-gather, else 1).
  So the all-gather's decode grows with N, CaSync-PS pays one re-encode of ``m/N`` elements and two decodes;
* compute: the reference run's ``time/compute_est`` (weak scaling: the batch per rank is fixed).

The buckets are summed one after another: overlap with backward or between buckets is not modelled, so the
exposed communication is all of it. The comm part is the prediction with every codec fit set to zero, the codec
part the rest. DeepSpeed's own dense step is one all-reduce of all gradients, with its flatten and copy-back
priced as stage and write-back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from ds_gravac.compress.base import Section, TensorPlan
from ds_gravac.sync.cost_model.fits import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, FitTable,
                                            LinearFit, decode_key, encode_key)
from ds_gravac.sync.cost_model.predict import compressed_time, dense_time

from .scale_laws import Collectives

LEVEL = 1.0                       # the synthetic plans' level: one encode and one decode fit per system


@dataclass(frozen=True)
class Kernels:
    """Per-step kernel costs of one system, in seconds per element (compute: per step)."""

    compute_s: float
    stage: float = 0.0
    writeback: float = 0.0
    encode: float = 0.0
    decode: float = 0.0

    def table(self, coll: Collectives, n: int, law_only: bool = False, codec: bool = True) -> FitTable:
        zero = LinearFit(0.0, 0.0)
        fits = {op: coll.fit(op, n, law_only) for op in (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL)}
        per = {STAGE: self.stage, WRITEBACK: self.writeback, encode_key(LEVEL): self.encode,
               decode_key(LEVEL): self.decode}
        fits.update({k: LinearFit(0.0, v) if codec else zero for k, v in per.items()})
        return FitTable(fits)


def rows_decoded(exchange: str, n: int) -> int:
    return n if exchange == "allgather" else 1


def kernels_from_record(rec: Mapping[str, float], buckets: Sequence[Mapping[str, Any]], n: int,
                        compute_s: Optional[float] = None) -> Kernels:
    """Per-element rates from a run's median step record (``stage_s`` … ``decompress_s``) and its buckets at N."""
    total = sum(b["numel"] for b in buckets)
    comp = [b for b in buckets if b["exchange"] != "dense"]
    m_c = sum(b["numel"] for b in comp)
    rows = rows_decoded(comp[0]["exchange"], n) if comp else 1
    compute = rec.get("compute_s") if compute_s is None else compute_s
    return Kernels(compute_s=float(compute or 0.0), stage=rec.get("stage_s", 0.0) / total,
                   writeback=rec.get("writeback_s", 0.0) / total,
                   encode=rec.get("compress_s", 0.0) / m_c if m_c else 0.0,
                   decode=rec.get("decompress_s", 0.0) / (rows * m_c) if m_c else 0.0)


def plans_of(bucket: Mapping[str, Any]) -> list[TensorPlan]:
    """``calls`` equal synthetic plans carrying the bucket's elements and first-round words."""
    calls = max(1, int(bucket["calls"]))
    numel, words = bucket["numel"] / calls, bucket["words1"] / calls
    return [TensorPlan(numel=int(round(numel)), level=LEVEL, k=0,
                       sections=(Section("w", torch.int32, int(round(words))),), values_sent=0)
            for _ in range(calls)]


def bucket_time(fits: FitTable, bucket: Mapping[str, Any], n: int) -> float:
    """Seconds of one bucket (see the module docstring)."""
    ex, numel = bucket["exchange"], bucket["numel"]
    if ex == "dense":
        return dense_time(fits, numel, 4)
    plans = plans_of(bucket)
    if ex == "two_round":
        edges = fits.get(STAGE)(numel) + fits.get(WRITEBACK)(numel)
        codec = sum(fits.codec(k, LEVEL)(p.numel) for p in plans for k in ("encode", "decode"))
        link = fits.get(ALL_REDUCE)
        return edges + codec + link(4 * bucket["words1"]) + (link(4 * bucket["words2"]) if bucket["words2"] else 0)
    return compressed_time(fits, ex, numel, n, plans)


def bytes_sent(buckets: Sequence[Mapping[str, Any]], n: int) -> float:
    """Logical bytes one rank sends per step (what the exchanges' ``bytes_sent`` count)."""
    ring = 2.0 * (n - 1) / n
    total = 0.0
    for b in buckets:
        ex, w1, w2 = b["exchange"], 4.0 * b["words1"], 4.0 * b["words2"]
        total += {"dense": ring * w1, "allreduce": ring * w1, "two_round": ring * (w1 + w2),
                  "allgather": (n - 1) * w1, "casync_ps": 2.0 * (n - 1) * w1 / n}[ex]
    return total


def predict_step(kernels: Kernels, buckets: Sequence[Mapping[str, Any]], coll: Collectives, n: int,
                 law_only: bool = False) -> dict[str, float]:
    """``{"step", "compute", "codec", "comm", "bytes"}`` at N ranks."""
    full = sum(bucket_time(kernels.table(coll, n, law_only), b, n) for b in buckets)
    comm = sum(bucket_time(kernels.table(coll, n, law_only, codec=False), b, n) for b in buckets)
    return {"step": kernels.compute_s + full, "compute": kernels.compute_s, "codec": full - comm, "comm": comm,
            "bytes": bytes_sent(buckets, n)}

