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

Overlap with backward (``scale_overlap``): a rank has one core, so backward and each bucket's stage and encode
(``pre``) run one after another on it, while its collectives run one after another on the link. Bucket i (in the
order its gradients are ready) is encoded once backward reaches its ready fraction ``f_i``, at
``c_i = f_i·T_bwd + Σ_{j≤i} pre_j``; its collectives start at ``max(c_i, end of bucket i−1's)``. Decode and
write-back (``post``) follow the wait for the last one. So

    step = compute + codec + max(0, end of the last collective − T_bwd − Σ pre),   T_bwd = share · compute

and the exposed communication is that last term (``comm``; ``comm_total`` is all of it). Without a profile
(``backward_share`` 0: inputs collected before this model) nothing overlaps and every second adds, as before.
DeepSpeed's own dense step is one all-reduce of all gradients after backward (ready 1.0), with its flatten and
copy-back priced as stage and write-back. Not modelled: gloo's threads taking
CPU from backward while they send (the measured compute of a run includes what they took), and PowerSGD's second
round waiting on the orthogonalization between the rounds (its encode counts as ``pre``).
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

CODEC_KEYS = (STAGE, WRITEBACK, encode_key(LEVEL), decode_key(LEVEL))
PRE_KEYS = (STAGE, encode_key(LEVEL))      # on the core before the bucket's collectives


@dataclass(frozen=True)
class Kernels:
    """Per-step kernel costs of one system, in seconds per element (compute: per step)."""

    compute_s: float
    backward_share: float = 0.0          # T_bwd / compute (scale_overlap); 0: no overlap with backward
    stage: float = 0.0
    writeback: float = 0.0
    encode: float = 0.0
    decode: float = 0.0

    def table(self, coll: Collectives, n: int, law_only: bool = False, codec: Sequence[str] = CODEC_KEYS
              ) -> FitTable:
        """The fits of N ranks; codec kernels outside ``codec`` cost nothing."""
        zero = LinearFit(0.0, 0.0)
        fits = {op: coll.fit(op, n, law_only) for op in (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL)}
        per = {STAGE: self.stage, WRITEBACK: self.writeback, encode_key(LEVEL): self.encode,
               decode_key(LEVEL): self.decode}
        fits.update({k: LinearFit(0.0, v) if k in codec else zero for k, v in per.items()})
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
                 law_only: bool = False, codec_scale: float = 1.0) -> dict[str, float]:
    """``{"step", "compute", "codec", "comm", "comm_total", "bytes"}`` at N ranks (``comm``: exposed);
    ``codec_scale`` multiplies every codec second (an oversubscribed run's own codec)."""
    tables = [kernels.table(coll, n, law_only, keys) for keys in (CODEC_KEYS, PRE_KEYS, ())]
    timed = []
    for b in buckets:
        full, pre, link = (bucket_time(t, b, n) for t in tables)
        timed.append((float(b.get("ready", 1.0)), codec_scale * (pre - link), link,
                      codec_scale * (full - pre)))
    timed.sort(key=lambda t: t[0])                       # stable: equal ready fractions keep the plan's order
    backward = kernels.backward_share * kernels.compute_s
    core = link_free = 0.0
    for ready, pre, link, _ in timed:
        core += pre
        link_free = max(ready * backward + core, link_free) + link
    codec = sum(t[1] + t[3] for t in timed)
    total = sum(t[2] for t in timed)
    exposed = max(0.0, link_free - backward - core) if kernels.backward_share > 0 else total
    return {"step": kernels.compute_s + codec + exposed, "compute": kernels.compute_s, "codec": codec,
            "comm": exposed, "comm_total": total, "bytes": bytes_sent(buckets, n)}
