"""Micro-benchmark rows of the quantizers (``Kind.QUANTIZED``) and the half casts (``fp16``, ``bf16``).

``micro`` times per-tensor codecs at a fixed N; these compressors depend on the world size itself. Quantizers
encode *bucket partitions* (``PartitionCodec``: the bucket's flat input cut into N slices of L = ceil(n_b/N)
elements, one per owner rank) and exchange them with CaSync-PS (all-to-all, owner merge and re-encode,
all-gather) or, with ``quantized_exchange: "allgather"``, gather every rank's whole-bucket payload; the half
casts pre-divide by N and all-reduce in half precision. So for every compressor, every level of its grid
(``cf_grid`` values, through ``realize_cf``) and every simulated N (``--world-sizes``), this module builds N ranks
with micro's ``Rank`` — the synchronizer's planner, bucket plan, codecs and memory — plus the
``ServerResiduals`` the synchronizer would enable, and plays steps without any process group:

step 0        every rank stages and encodes its own seeded gradients (seed + rank) at step 0, leaves its worker
              memory and commits; the all-to-all is played by copying slices, every owner runs its merge
              (``CaSyncPS.advance`` without its all-gather), and rank 0 decodes the gathered ``q_j``. The decoded
              aggregate is the correctness guard: ``rel_err = ‖D − mean_w x_w‖ / ‖mean_w x_w‖`` (and the
              cosine) against the exact mean of the staged inputs of that step (= the gradients, as memory
              starts empty; EF-signSGD: γ·g). The all-gather and the half all-reduce are checked the same way.
timed steps   rank 0 only, ``repeats`` of them (step 0 was the warm-up), memory and server residual carried:
              t_stage (``memory.stage``, x = g + r), t_compress (``codec.encode`` of all N slices of every bucket),
              t_leave_memory (worker error feedback, x − D(p)), t_encode = the two; PS: t_merge (decode the N rows
              of the owned slice, add the server residual, re-encode, stage the new residual) and
              ``t_decompress_n{N}`` (decode the N gathered ``q_j``); all-gather: ``t_decompress_n{N}`` = decode
              of N whole-bucket payloads; half: the cast back of the reduced payload. The other ranks' rows are
              their step-0 payloads (as micro's ``others``); the received buffers are filled untimed.

Passes: a phase's time over one memory pass of the fp32 elements it produces or decodes — micro's ``t_pass``
(``x.abs()`` over the set, re-measured next to every level) scaled linearly by that element count: encode and
the PS/half decode n (the compressed elements), the merge N·ΣL (N rows of the owned slices), the all-gather decode
N·n. ``passes`` is against fresh outputs (micro's headline), ``passes_out`` against preallocated ones (stricter);
``within_3_passes`` holds when every codec phase of the row (encode, merge, decode) is at most 3 ``passes``.

Bytes per rank and step, from the exchange objects themselves (``bytes_sent``): PS ``2(N−1)`` slice payloads per
bucket, all-gather ``(N−1)`` whole-bucket payloads, half a ring all-reduce of the half payload; ``dense_bytes``
is the fp32 ring all-reduce ``2(N−1)/N·4·n``; ``wire_cf`` = 4·n / payload bytes (the N slices of a bucket);
``pays`` is the pattern's own test (false: the planner would send those buckets dense at this N).
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Optional, Sequence

import torch

from ds_gravac.compress.base import Compressor, Kind
from ds_gravac.config import GravacConfig
from ds_gravac.sync.exchange import CaSyncPS, HalfAllReduce, PayloadAllGather
from ds_gravac.sync.server_memory import ServerResiduals

from .micro_grads import GradSet
from .micro_rank import Rank, fresh_compressor, reduce_rule
from .micro_settings import DECODE_NS
from .micro_timing import stats

PASS_TARGET = 3.0
TIMES = ("t_stage", "t_compress", "t_leave_memory", "t_encode", "t_merge", "t_decode_ps", "t_decode_ag",
         "t_decode_half")


def handles(comp: Compressor) -> bool:
    """The compressors this module measures instead of micro's per-tensor driver."""
    return comp.kind == Kind.QUANTIZED or comp.exchange == "half_allreduce"


def grid_levels(comp: Compressor) -> list[float]:
    """Every realizable level of the compressor's grid, realized through its own ``realize_cf``."""
    return sorted({float(comp.realize_cf(c)) for c in (comp.cf_grid() or [comp.default_cf()])})


def server_enabled(comp: Compressor, cfg: GravacConfig) -> bool:
    """Whether the synchronizer keeps server residuals for this compressor under CaSync-PS (its own rule)."""
    return bool(getattr(comp, "server_error_feedback", False)) and (cfg.error_feedback or comp.owns_state)


def sim_rank(gs: GradSet, comp: Compressor, rank: int, world_size: int, cfg: GravacConfig) -> Rank:
    """micro's ``Rank`` at ``world_size``, rebuilt with the server residuals the synchronizer would give it
    (``Rank`` builds its planner with none, which is right for every other compressor)."""
    r = Rank(gs, comp, rank, world_size, cfg)
    if comp.kind == Kind.QUANTIZED:
        r.planner.server = ServerResiduals(server_enabled(comp, cfg), world_size)
        r.planner.build(list(r.plan.order), frozen=True)
        r.plan = r.planner.plan
        r.compressible = [b.index for b in r.plan.buckets if b.compressible]
    return r


def owner_merge(ex: CaSyncPS) -> None:
    """``CaSyncPS.advance`` without its all-gather: the owner's merge and re-encode into ``ex.q``."""
    ex.codec.serve(ex.layout, ex.recv, ex.q)


def half_sum(rows: Sequence[torch.Tensor], dtype: torch.dtype, out: torch.Tensor) -> None:
    """What the half all-reduce leaves in the send buffer: the rows summed in their half dtype, in rank order."""
    acc = rows[0].view(dtype).clone()
    for r in rows[1:]:
        acc.add_(r.view(dtype))
    out.view(dtype).copy_(acc)


class Guard:
    """Relative error and cosine of a decoded aggregate against the exact mean, accumulated over buckets."""

    def __init__(self) -> None:
        self.err2 = self.ref2 = self.out2 = self.dot = 0.0

    def add(self, out: torch.Tensor, ref: torch.Tensor) -> None:
        o, r = out.double(), ref.double()
        self.err2 += float((o - r).square().sum())
        self.ref2 += float(r.square().sum())
        self.out2 += float(o.square().sum())
        self.dot += float((o * r).sum())

    def result(self) -> dict[str, float]:
        return {"rel_err": (self.err2 / self.ref2) ** 0.5 if self.ref2 > 0 else float("nan"),
                "cosine": self.dot / (self.out2 * self.ref2) ** 0.5 if self.out2 * self.ref2 > 0 else 0.0}


# ---- one level ------------------------------------------------------------------------------------------
class LevelRun:
    """One compressor at one level and one N: the step-0 play of every rank, then rank 0's timed steps."""

    def __init__(self, ranks: list[Rank], level: float, bulk: bool) -> None:
        self.ranks, self.own, self.n, self.bulk = ranks, ranks[0], len(ranks), bulk
        self.quantized = self.own.comp.kind == Kind.QUANTIZED
        self.scale = reduce_rule(self.n).output_scale
        for r in ranks:
            r.memory.reset()
            r.planner.server.reset()
        self.send = {b: self.own.levels(b, level, 0) for b in self.own.compressible}
        self.ps: dict[int, CaSyncPS] = {}
        self.ag: dict[int, PayloadAllGather] = {}
        self.half: dict[int, HalfAllReduce] = {}
        self.rows_ps: dict[int, list[torch.Tensor]] = {}     # other ranks' slice 0 (owner 0's all-to-all rows)
        self.rows_q: dict[int, list[torch.Tensor]] = {}      # other owners' q_j
        self.rows_full: dict[int, list[torch.Tensor]] = {}   # other ranks' whole send buffers

    def worker(self, r: Rank, b: int, step: int, mean: Optional[torch.Tensor] = None) -> tuple[Any, list[float]]:
        """Stage, encode, leave the worker memory and commit it (the agreement is assumed finite)."""
        mem, codec, ctxs = r.memory.bucket(b), r.planner.codecs[b], r.planner.ctxs[b]
        t0 = time.perf_counter()
        xs = r.stage(b, step)
        t1 = time.perf_counter()
        if mean is not None:                     # the guard's exact mean (untimed)
            mean.add_(mem.scratch, alpha=1.0 / self.n)
        t2 = time.perf_counter()
        lay, _ = codec.encode(xs, self.send[b], (), ())
        t3 = time.perf_counter()
        codec.leave_memory(xs, lay)
        t4 = time.perf_counter()
        mem.commit_compressed(r.comp, None if self.quantized else lay.payloads, ctxs)
        return lay, [t1 - t0, t3 - t2, t4 - t3]

    def step0(self) -> dict[str, dict[str, float]]:
        """Every rank's step 0, the exchanges played by copying, and the guards of every pattern."""
        own, n, scale = self.own, self.n, self.scale
        guards = {k: Guard() for k in (("casync_ps", "allgather") if self.quantized else ("half_allreduce",))}
        for b in own.compressible:
            mean = torch.zeros(own.plan.buckets[b].numel)
            lays = [self.worker(r, b, 0, mean)[0] for r in self.ranks]
            out = own.memory.bucket(b).scratch
            what = f"bucket {b} (compressed)"
            if not self.quantized:
                ex = self.half[b] = HalfAllReduce(own.planner.codecs[b], lays[0], n, what, self.bulk)
                self.rows_full[b] = [lay.send.clone() for lay in lays[1:]]
                half_sum([lay.send for lay in lays], own.comp.dtype, lays[0].send)
                guards["half_allreduce"].add(ex.result(out, scale), mean)
                continue
            exs = [CaSyncPS(r.planner.codecs[b], lay, n, what, self.bulk) for r, lay in zip(self.ranks, lays)]
            p = exs[0].words
            for j, ex in enumerate(exs):            # the all-to-all: owner j receives every rank's slice j
                ex.recv.view(n, p).copy_(torch.stack([lay.send[j * p:(j + 1) * p] for lay in lays]))
                owner_merge(ex)
            for r in self.ranks:
                r.planner.server.commit(b)
            self.ps[b] = exs[0]
            exs[0].gathered.view(n, p).copy_(torch.stack([ex.q for ex in exs]))
            guards["casync_ps"].add(exs[0].result(out, scale), mean)
            self.rows_ps[b] = [lay.send[:p].clone() for lay in lays[1:]]
            self.rows_q[b] = [ex.q.clone() for ex in exs[1:]]
            self.rows_full[b] = [lay.send.clone() for lay in lays[1:]]
            ag = self.ag[b] = PayloadAllGather(own.planner.codecs[b], lays[0], n, what, self.bulk)
            ag.recv.view(n, lays[0].words).copy_(torch.stack([lay.send for lay in lays]))
            guards["allgather"].add(ag.result(out, scale), mean)
        for r in self.ranks:
            for codec in r.planner.codecs.values():
                codec.end_step()
        return {k: g.result() for k, g in guards.items()}

    def step(self, step: int) -> dict[str, float]:
        """One timed step of rank 0 (seconds per phase, summed over buckets)."""
        own, n, scale = self.own, self.n, self.scale
        t = dict.fromkeys(TIMES, 0.0)
        lays = {}
        for b in own.compressible:
            lays[b], (ts, tc, tl) = self.worker(own, b, step)
            t["t_stage"] += ts
            t["t_compress"] += tc
            t["t_leave_memory"] += tl
        t["t_encode"] = t["t_compress"] + t["t_leave_memory"]
        outs = {b: own.memory.bucket(b).scratch for b in own.compressible}
        if self.quantized:
            for b, ex in self.ps.items():
                assert ex.layout is lays[b], "the send layout changed between steps"
                ex.recv.view(n, ex.words).copy_(torch.stack([lays[b].send[:ex.words], *self.rows_ps[b]]))
            t0 = time.perf_counter()
            for ex in self.ps.values():
                owner_merge(ex)
            t["t_merge"] = time.perf_counter() - t0
            for b, ex in self.ps.items():
                own.planner.server.commit(b)
                ex.gathered.view(n, ex.words).copy_(torch.stack([ex.q, *self.rows_q[b]]))
            t["t_decode_ps"] = timed_once(lambda: [ex.result(outs[b], scale) for b, ex in self.ps.items()])
            for b, ex in self.ag.items():
                ex.recv.view(n, lays[b].words).copy_(torch.stack([lays[b].send, *self.rows_full[b]]))
            t["t_decode_ag"] = timed_once(lambda: [ex.result(outs[b], scale) for b, ex in self.ag.items()])
        else:
            for b in self.half:
                half_sum([lays[b].send, *self.rows_full[b]], own.comp.dtype, lays[b].send)
            t["t_decode_half"] = timed_once(lambda: [ex.result(outs[b], scale) for b, ex in self.half.items()])
        for codec in own.planner.codecs.values():
            codec.end_step()
        return t


def timed_once(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- rows -----------------------------------------------------------------------------------------------
def run_level(gs: GradSet, ranks: list[Rank], level: float, cfg: GravacConfig) -> list[dict[str, Any]]:
    """The rows (one per exchange pattern) of one level at N = len(ranks)."""
    run = LevelRun(ranks, level, cfg.bulk)
    guards = run.step0()
    samples: dict[str, list[float]] = {k: [] for k in TIMES}
    for step in range(1, gs.repeats + 1):          # step 0 (every buffer allocated, every path run) warmed up
        for k, v in run.step(step).items():
            samples[k].append(v)
    times = {k: stats(v) for k, v in samples.items()}
    fresh, out = gs.pass_now()
    own, n = run.own, run.n
    buckets = [own.plan.buckets[b] for b in own.compressible]
    numel = sum(b.numel for b in buckets)
    lays = {b: own.planner.codecs[b].layout(run.send[b]) for b in own.compressible}
    payload = sum(4 * lay.payload_words for lay in lays.values())
    dense = sum(2.0 * (n - 1) / n * 4 * b.numel for b in buckets)
    comp = own.comp
    common = {"level": float(next(iter(run.send.values()))[0]), "default_level": level == comp.default_cf(),
              "world_size": n, "tensors": sum(len(b.members) for b in buckets), "buckets": len(buckets),
              "bucket_numel": [b.numel for b in buckets], "compressed_numel": numel, "payload_bytes": payload,
              "wire_cf": 4 * numel / payload, "dense_bytes": dense, "t_pass_local": fresh, "t_pass_out_local": out,
              "worker_error_feedback": bool(getattr(comp, "worker_error_feedback", False)) and cfg.error_feedback,
              **{k: times[k] for k in ("t_stage", "t_compress", "t_leave_memory", "t_encode")},
              "gbps_compress": 4 * numel / times["t_compress"]["median"] / 1e9}
    dec = f"t_decompress_n{n}"
    if run.quantized:
        common["partition_numel"] = [own.planner.codecs[b].L for b in own.compressible]
        merged = n * sum(common["partition_numel"])            # N rows of the owned slices
        patterns = [("casync_ps", run.ps, {"t_merge": (times["t_merge"], merged), dec: (times["t_decode_ps"], numel)}),
                    ("allgather", run.ag, {dec: (times["t_decode_ag"], n * numel)})]
    else:
        patterns = [("half_allreduce", run.half, {dec: (times["t_decode_half"], numel)})]
    rows = []
    for name, exs, phases in patterns:
        phases = {"t_encode": (times["t_encode"], numel), **phases}
        row = {"exchange": name, **common, **{k: s for k, (s, _) in phases.items() if k != "t_encode"}}
        if name == "casync_ps":
            row["server_error_feedback"] = own.planner.server.enabled
        row["bytes_sent"] = sum(ex.bytes_sent for ex in exs.values())
        row["bytes_vs_dense"] = row["bytes_sent"] / dense
        row["pays"] = all(type(ex).pays(lays[b].payload_words, own.plan.buckets[b].numel, n, reduce_rule(n))
                          for b, ex in exs.items())
        row["passes"] = {k: s["median"] / (fresh["median"] * m / gs.numel) for k, (s, m) in phases.items()}
        row["passes_out"] = {k: s["median"] / (out["median"] * m / gs.numel) for k, (s, m) in phases.items()}
        row["passes_stage"] = times["t_stage"]["median"] / (fresh["median"] * numel / gs.numel)
        row["passes_encode"] = row["passes"]["t_encode"]
        row["passes_decode"] = row["passes"][dec]
        if "t_merge" in phases:
            row["passes_merge"] = row["passes"]["t_merge"]
        row["over_3_passes"] = [k for k, v in row["passes"].items() if v > PASS_TARGET]
        row["within_3_passes"] = not row["over_3_passes"]
        row.update(guards[name])
        rows.append(row)
    return rows


def bench(gs: GradSet, set_name: str, label: str, name: str, comp: Compressor, cfg: GravacConfig,
          args: argparse.Namespace, report: dict[str, Any]) -> None:
    """micro's ``bench_compressor`` for the compressors of :func:`handles`: rows into ``report["results"]``."""
    world_sizes = list(getattr(args, "world_sizes", None) or DECODE_NS)
    report["config"]["world_sizes"] = world_sizes
    for n in world_sizes:
        base = {"set": set_name, "compressor": label, "name": name, "world_size": n}
        if n > len(gs.rank_grads):
            report["results"].append({**base, "level": comp.default_cf(),
                                      "skipped": f"N = {n} > {len(gs.rank_grads)} seeded gradient sets"})
            continue
        ranks = [sim_rank(gs, comp if r == 0 else fresh_compressor(comp), r, n, cfg) for r in range(n)]
        for level in grid_levels(comp):
            if not ranks[0].compressible:
                report["results"].append({**base, "level": level, "skipped": "accepts no tensor (sent dense)"})
                continue
            try:
                rows = run_level(gs, ranks, level, cfg)
            except Exception as exc:  # record, continue with the next level (as micro does)
                rows = [{"level": level, "error": f"{type(exc).__name__}: {exc}"}]
            report["results"] += [{**base, **r} for r in rows]
        del ranks


def print_rows(report: dict[str, Any], set_name: str) -> None:
    """The quantizer and half-cast rows of one set (micro's ``print_table`` prints the others)."""
    rows = [r for r in report["results"] if r["set"] == set_name and "world_size" in r]
    if not rows:
        return
    ms = 1e3
    print(f"quantizers and half casts (passes per phase against fresh outputs; target <= {PASS_TARGET:g})")
    print(f"{'compressor':<11}{'level':>6}{'exchange':>16}{'N':>3}{'enc ms':>8}{'merge ms':>9}{'dec ms':>8}"
          f"{'p enc':>7}{'p mrg':>7}{'p dec':>7}{'<=3':>5}{'bytes/dense':>12}{'wire CF':>8}{'rel err':>9}"
          f"{'cos':>7}{'pass ms':>8}")
    for r in rows:
        if "t_encode" not in r:
            print(f"{r['compressor']:<11}{r.get('level', 0):>6g}{'':>16}{r['world_size']:>3}  "
                  f"{r.get('error') or r.get('skipped')}")
            continue
        dec = r[f"t_decompress_n{r['world_size']}"]["median"]
        merge = f"{r['t_merge']['median'] * ms:>9.1f}" if "t_merge" in r else f"{'-':>9}"
        pm = f"{r['passes_merge']:>7.2f}" if "passes_merge" in r else f"{'-':>7}"
        print(f"{r['compressor']:<11}{r['level']:>6g}{r['exchange']:>16}{r['world_size']:>3}"
              f"{r['t_encode']['median'] * ms:>8.1f}{merge}{dec * ms:>8.1f}{r['passes_encode']:>7.2f}{pm}"
              f"{r['passes_decode']:>7.2f}{'yes' if r['within_3_passes'] else 'no':>5}{r['bytes_vs_dense']:>12.4f}"
              f"{r['wire_cf']:>8.2f}{r['rel_err']:>9.2e}{r['cosine']:>7.3f}{r['t_pass_local']['median'] * ms:>8.1f}")
