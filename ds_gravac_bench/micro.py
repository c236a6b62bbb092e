"""Compressor micro-benchmarks: CPU cost and extra memory of every compressor, on the synchronizer's own codec path.

For one gradient set (a model's real per-tensor shapes, synthetic or real gradients) and one compressor the
benchmark builds what the synchronizer of one rank builds — parameters (``torch.nn.Parameter`` with ``.grad`` set
to the gradients), the static classification and the bucket plan (``bucket_cap_mb`` MiB of fp32 per bucket), one
``CompressCtx`` per member, one ``BucketCodec`` per compressible bucket and the ``ErrorFeedbackMemory`` — with the
synchronizer's own ``Planner`` (so contexts come from the same ``_make_ctx``: SGD lr 0.1, momentum 0.9, weight
decay 1e-4, as in the ResNet/VGG configs). Each timed step then runs, per compressible bucket in plan order, what
``Synchronizer._launch_compressible`` / ``_send_compressible`` / ``_complete`` run for a compressed bucket, with
those objects and nothing copied:

    t_stage       release_gradients, step number into the contexts, memory.stage (x = g + r, or the compressor's
                  ``compensate``, into the bucket's scratch), ctx.residual = x
    t_norm        Σ dot(x, x) per member (the gain denominator and the non-finite check of every step)
    t_compress    codec.encode at the sent level into the cached send layout (no probes)
    t_residual    codec.leave_memory (scratch → the memory left after sending) + memory.commit_compressed (slot
                  swap; DGC: momentum update) + codec.commit_aggregate (low-rank: PowerSGD's E = X − G, the
                  shared factors), also reported split as t_leave_memory / t_commit_memory / t_aggregate
    t_round2      two-round patterns (PowerSGD): codec.next_round, the work between the rounds (orthogonalize
                  the reduced P, project Xᵀ on it); rank 0's own P stands in for the reduced one
    t_decompress_n{2,4}
                  exchange.result(scratch, 1/N) of the compressor's exchange pattern (PayloadAllGather:
                  decode_rows of N rows; PayloadAllReduce: decode_sum of the summed payload, N-independent)

Nothing is communicated. The N rows are real payloads of N different seeded gradient sets (seed, seed+1, ...),
each encoded by its own rank's planner/codec/memory (own compressor instance, ``ctx.rank`` = its rank): row 0 is
rank 0's payload of its last timed step, rows 1.. are the other ranks' first-step payloads at the same step number
(so Random-k's shared indices agree). The exchange object is constructed exactly as a step does (which allocates
its receive buffer) on a codec of its own per N — a layout's receive buffer is sized once, for one world size — and
its received data is filled with what the collective would leave there. ``p.grad`` is not rewritten after the
decode (``write_grads`` makes fp32 contiguous gradients views of the scratch, no copy), so every step sees the
same fresh gradients with the memory it accumulated. Every level starts from an empty memory.

``passes = t / t_pass``: ``t_pass`` is the median time of ``x.abs()`` over all tensors of the set, re-measured
next to every row (``passes_out``: against ``torch.abs(x, out=buf)`` into preallocated buffers, the stricter bound;
fresh outputs pay page faults). Reference lines: naive Top-k (``torch.topk(|x|, k)`` + gather), a 1%-sampled
threshold estimate, and multi-level vs direct through ``codec.encode`` with probes (θ_min compressed, higher
levels derived with ``compress_from``, each probe's ‖C(x)‖² included, as in a GraVAC step) against one direct probe
encode per level.

Extra memory per rank (``memory`` rows), as a multiple of the model's fp32 gradient bytes (all parameters), at
N = 2 and 8, for a step at each sent level and for a 5-level GraVAC search (send θ_min = 10, probes 10, 20, 40,
160, 1000): the memory object's slots + scratch (``ErrorFeedbackMemory.nbytes()``) + the codec's send and probe
buffers (``BucketCodec.nbytes()`` after the step's encode, on fresh codecs) + the exchange's receive buffer
(the growth of ``BucketCodec.nbytes()`` when the exchange is constructed; grows with N for all-gather, none for
all-reduce, which reduces in the send buffer). Buckets that the sparse fallback would send dense at that N get no
payload, as in a real step. Reported beside it and not in the total: the layout's bulk-decode index tensors, which
``BucketCodec.nbytes()`` does not count, tensors the compressor object itself holds (Random-k's index cache), and
an estimate of the bulk decode's transient peak (12·N·k bytes for the largest bucket: the gathered int32 indices,
their offset copy and the gathered values). Dense-classified tensors keep no buffer of ds_gravac: their bucket is flattened by
``DenseAllReduce`` exactly as DeepSpeed flattens it, a transient copy held until the step's end, reported
(``flatten_transient_bytes``) and not counted as extra. Target printed next to the numbers: Top-k with error
feedback ≤ 2 extra copies.

    OMP_NUM_THREADS=1 python -m ds_gravac_bench.micro --sets resnet101 --compressors topk --out r.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress.base import Compressor, Kind, k_for
from ds_gravac.compress.registry import lookup, registered_names
from ds_gravac.config import GravacConfig
from ds_gravac.sync.buckets import BucketPlan, classify
from ds_gravac.sync.codec import BucketCodec, SendLayout
from ds_gravac.sync.exchange import Exchange, PayloadAllGather, PayloadAllReduce, TwoRoundAllReduce, \
    payload_exchange
from ds_gravac.sync.memory import ErrorFeedbackMemory
from ds_gravac.sync.planner import Planner
from ds_gravac.sync.reduce_rule import ReduceRule

ROOT = Path(__file__).resolve().parents[1]

SETS = ("resnet101", "vgg16", "lstm")
MODEL_ARGS = {"resnet101": ("resnet101", {"num_classes": 10}), "vgg16": ("vgg16", {"num_classes": 100}),
              "lstm": ("lstm", {"vocab_size": 10000, "size": "large"})}
COMPUTE_REF_S = {"resnet101": 1.3, "vgg16": 2.1, "lstm": None}   # reference fwd+bwd s, batch 32, one core
TOPK_ALGORITHMS = ("auto", "topk", "kthvalue", "sort")
SMOKE_SHAPES = [(250, 240), (20000,), (64, 3, 7, 7), (1000,), (9592,)]   # 10^5 elements
SMOKE_BUCKET_CAP_MB = 0.1            # several buckets even in the smoke set
OPTIMIZER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}           # the ResNet/VGG configs' SGD
DECODE_NS = (2, 4)                   # world sizes whose decode is timed
MEMORY_NS = (2, 8)                   # world sizes whose extra memory is reported
SEARCH_SEND, SEARCH_PROBES = 10.0, (10.0, 20.0, 40.0, 160.0, 1000.0)   # a 5-level GraVAC search step
TARGET_EXTRA_X = 2.0                 # Top-k with error feedback: at most two extra fp32 copies of the gradients
STEP_KEYS = ("t_stage", "t_norm", "t_compress", "t_leave_memory", "t_commit_memory", "t_round2", "t_aggregate",
             "t_residual")
PHASES = ("t_stage", "t_norm", "t_compress", "t_round2", "t_decompress_n2", "t_decompress_n4", "t_residual")
LOWRANK_RANKS = (1, 2, 4)


# ---- statistics and timing ------------------------------------------------------------------------------
def stats(samples: Sequence[float]) -> dict[str, float]:
    """Median and 10th/90th percentiles (linear interpolation), seconds."""
    xs = sorted(samples)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"median": q(0.5), "p10": q(0.1), "p90": q(0.9), "n": len(xs)}


def timed(fn: Callable[[int], Any], repeats: int, prepare: Optional[Callable[[int], Any]] = None
          ) -> dict[str, float]:
    """Run ``fn(i)`` once as warm-up and ``repeats`` times; ``prepare(i)`` runs untimed before each call."""
    samples = []
    for i in range(repeats + 1):
        if prepare is not None:
            prepare(i)
        t0 = time.perf_counter()
        fn(i)
        dt = time.perf_counter() - t0
        if i > 0:
            samples.append(dt)
    return stats(samples)


def nbytes(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def held_tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors an object holds in its attributes (through dicts, lists and tuples; each storage once)."""
    seen: set[int] = set()
    total, stack = 0, [vars(obj)]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set)):
            stack.extend(v)
    return total


# ---- gradient sets ------------------------------------------------------------------------------------
def set_shapes(name: str, smoke: bool) -> list[tuple[str, tuple[int, ...]]]:
    """Named parameter shapes of the set's model, built on the meta device (no memory, no download)."""
    if smoke:
        return [(f"{name}.t{i}", s) for i, s in enumerate(SMOKE_SHAPES)]
    from runners.models import build_model
    model_name, kw = MODEL_ARGS[name]
    with torch.device("meta"):
        model = build_model(model_name, **kw)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def laplace_like(numel: int, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Laplace(0, scale) by inversion; |2u-1| is clamped below 1 so fp32 never yields an infinite sample."""
    s = torch.rand(numel, generator=gen).sub_(0.5)
    mag = s.abs().mul_(2.0).clamp_(max=1.0 - 2.0 ** -24).neg_().log1p_().neg_()
    return torch.copysign(mag, s).mul_(scale)


def synthetic_grads(shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> list[torch.Tensor]:
    """Seeded Laplace noise, one scale per tensor (10^-4 … 10^-1, log-uniform), flat fp32."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.empty(len(shapes)).uniform_(-4.0, -1.0, generator=gen)
    return [laplace_like(math.prod(s), float(10 ** sc), gen) for (_, s), sc in zip(shapes, scales)]


def real_grads(name: str, seed: int) -> list[torch.Tensor]:
    """Gradients of one forward/backward on synthetic inputs (batch 8 images, or 35x20 tokens)."""
    from runners.models import build_model
    torch.manual_seed(seed)
    model_name, kw = MODEL_ARGS[name]
    model = build_model(model_name, **kw)
    if name == "lstm":
        tokens = torch.randint(0, 10000, (36, 20))
        out, _ = model(tokens[:-1], model.init_hidden(20))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, 10000), tokens[1:].reshape(-1))
    else:
        images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, kw["num_classes"], (8,))
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    return [p.grad.detach().reshape(-1).clone() for p in model.parameters()]


def measure_compute(name: str, repeats: int) -> dict[str, float]:
    """Forward+backward time of the set's model at batch 32 (LSTM: 35 x 20 tokens)."""
    from runners.models import build_model
    model_name, kw = MODEL_ARGS[name]
    model = build_model(model_name, **kw)
    if name == "lstm":
        tokens = torch.randint(0, 10000, (36, 20))

        def step(_: int) -> None:
            out, _h = model(tokens[:-1], model.init_hidden(20))
            torch.nn.functional.cross_entropy(out.reshape(-1, 10000), tokens[1:].reshape(-1)).backward()
    else:
        images, labels = torch.randn(32, 3, 32, 32), torch.randint(0, kw["num_classes"], (32,))

        def step(_: int) -> None:
            torch.nn.functional.cross_entropy(model(images), labels).backward()
    return timed(step, max(1, min(repeats, 3)))


class GradSet:
    """One gradient set: names and shapes, the parameter values every simulated rank shares, one seeded gradient
    set per rank (rank 0's is the set's own), and the memory-pass reference."""

    def __init__(self, names: list[str], shapes: list[tuple[int, ...]], rank_grads: list[list[torch.Tensor]],
                 repeats: int) -> None:
        self.names, self.shapes, self.rank_grads, self.repeats = names, shapes, rank_grads, repeats
        self.grads = rank_grads[0]
        self.data = [torch.zeros(s) for s in shapes]
        self.numel = sum(g.numel() for g in self.grads)
        self.grad_bytes = sum(g.numel() * 4 for g in self.grads)      # the model's gradients in fp32
        self.scratch = [torch.empty_like(g) for g in self.grads]
        self.t_pass, self.t_pass_out = self.pass_now()

    def pass_now(self) -> tuple[dict[str, float], dict[str, float]]:
        """(fresh-output, preallocated-output) pass times, re-measured next to each measurement so load
        drift on a shared core cancels in the ratios."""
        fresh = timed(lambda _: [g.abs() for g in self.grads], self.repeats)
        out = timed(lambda _: [torch.abs(g, out=o) for g, o in zip(self.grads, self.scratch)], self.repeats)
        return fresh, out

    def passes(self, s: dict[str, float], ref: Optional[dict[str, float]] = None) -> float:
        return s["median"] / (ref or self.t_pass)["median"]


# ---- one rank's production objects ----------------------------------------------------------------------
def reduce_rule(world_size: int) -> ReduceRule:
    """DeepSpeed's default averaging (mean, fp32 communication): compressed buckets decode with scale 1/N."""
    return ReduceRule(average=True, postscale=True, predivide=1.0, comm_dtype=torch.float32,
                      world_size=float(world_size))


def fresh_compressor(comp: Compressor) -> Compressor:
    """Another instance with the same parameters and levels (every rank has its own compressor object)."""
    other = type(comp)(comp.params.model_copy())
    if hasattr(comp, "bound"):       # low-rank: the same level kind and factor width
        other.bind_levels(comp.level_kind, comp.bound)
    other.phase = comp.phase
    return other


class Rank:
    """What ``Synchronizer.__init__`` builds on one rank, through the synchronizer's own planner: parameters with
    ``.grad`` set, classification, bucket plan (reverse registration order, as before the first step froze it),
    per-member contexts, one codec per compressible bucket and the error-feedback memory."""

    def __init__(self, gs: GradSet, comp: Compressor, rank: int, world_size: int, cfg: GravacConfig) -> None:
        self.comp, self.cfg, self.rank = comp, cfg, rank
        params = [torch.nn.Parameter(d) for d in gs.data]           # shared values, own gradients
        for p, g in zip(params, gs.rank_grads[rank]):
            p.grad = g.view(p.shape)
        named = [(n, p) for n, p in zip(gs.names, params) if p.requires_grad and p.numel() > 0]
        engine = SimpleNamespace(optimizer=torch.optim.SGD(params, **OPTIMIZER))
        self.members = classify(named, comp.accepts, cfg.min_compress_numel, comp.name != "none")
        self.pattern = payload_exchange(comp)
        self.memory = ErrorFeedbackMemory(comp, cfg.error_feedback)
        self.planner = Planner(engine, cfg, comp, self.members, self.memory, self.pattern, reduce_rule(world_size),
                               rank, world_size)
        self.planner.build(BucketPlan.provisional_order(len(self.members)), frozen=True)
        self.plan = self.planner.plan
        self.compressible = [b.index for b in self.plan.buckets if b.compressible]

    def levels(self, b: int, level: float, step: int) -> tuple[float, ...]:
        """The per-member level tuple of a compressed action (``Planner.action``: realized, then effective)."""
        return tuple(self.planner.level(level, step) for _ in self.plan.buckets[b].members)

    def stage(self, b: int, step: int) -> list[torch.Tensor]:
        """``_launch_compressible`` up to the staged input of bucket ``b``."""
        mem, ctxs = self.memory.bucket(b), self.planner.ctxs[b]
        mem.release_gradients()
        for ctx in ctxs:
            ctx.step = step
        xs = mem.stage(self.comp, ctxs, self.cfg.error_feedback)
        for ctx, x in zip(ctxs, xs):
            ctx.residual = x
        return xs

    def step(self, send: dict[int, tuple[float, ...]], step: int) -> dict[str, float]:
        """One compressed step of every compressible bucket, communication and decode left out; seconds per phase."""
        t = dict.fromkeys(STEP_KEYS, 0.0)
        for b in self.compressible:
            mem, codec, ctxs = self.memory.bucket(b), self.planner.codecs[b], self.planner.ctxs[b]
            t0 = time.perf_counter()
            xs = self.stage(b, step)
            t1 = time.perf_counter()
            float(torch.stack([torch.dot(x, x) for x in xs]).double().sum())
            t2 = time.perf_counter()
            lay, _ = codec.encode(xs, send[b], (), ())
            t3 = time.perf_counter()
            codec.leave_memory(xs, lay)
            t4 = time.perf_counter()
            mem.commit_compressed(self.comp, lay.payloads, ctxs)
            t5 = time.perf_counter()
            if lay.round2 is not None:
                codec.next_round(lay)
            t6 = time.perf_counter() if lay.round2 is not None else t5     # 0: no second round
            aggregate = 0.0
            if self.comp.owns_state:     # the decode before it is the exchange's result (timed as t_decompress)
                self.exchange(b, codec, lay, 1).result(mem.scratch, 1.0)
                t7 = time.perf_counter()
                codec.commit_aggregate(lay, mem.scratch)
                aggregate = time.perf_counter() - t7
            for key, dt in zip(STEP_KEYS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, aggregate)):
                t[key] += dt
        t["t_residual"] = t["t_leave_memory"] + t["t_commit_memory"] + t["t_aggregate"]
        for codec in self.planner.codecs.values():
            codec.end_step()
        return t

    def payloads(self, send: dict[int, tuple[float, ...]], step: int) -> dict[int, torch.Tensor]:
        """Stage and encode every compressible bucket (nothing committed); copies of the send buffers."""
        out = {}
        for b in self.compressible:
            lay, _ = self.planner.codecs[b].encode(self.stage(b, step), send[b], (), ())
            out[b] = lay.send.clone()
        return out

    def falls_back(self, codec: BucketCodec, levels: tuple[float, ...], world_size: int) -> bool:
        """``Planner.dense_at`` at another world size (the planner's own answer is for its world size)."""
        words = sum(p.words for p in codec.plans(levels))
        return self.cfg.sparse_fallback and not self.pattern.pays(words, codec.bucket.numel, world_size,
                                                                  reduce_rule(world_size))

    def exchange(self, b: int, codec: BucketCodec, lay: SendLayout, world_size: int) -> Exchange:
        """The bucket's exchange as ``_send_compressible`` constructs it (allocating the receive buffer); never
        launched."""
        return self.pattern(codec, lay, world_size, f"bucket {b} (compressed)", self.cfg.bulk)


def fill_received(ex: Exchange, codec: BucketCodec, lay: SendLayout, rows: list[torch.Tensor]) -> None:
    """Leave in the exchange's buffers what its collectives would: all-gather rows in rank order, or the
    all-reduce's elementwise sum in the send buffer. Two rounds: round 1's sum, then rank 0's second payload
    from it, times N for round 2's sum (the other ranks' second payloads cost the same and are not needed)."""
    if isinstance(ex, PayloadAllGather):
        lay.buffers["allgather"].view(len(rows), lay.words).copy_(torch.stack(rows))
    elif isinstance(ex, PayloadAllReduce):
        lay.send.copy_(torch.stack(rows).sum(0))
    elif isinstance(ex, TwoRoundAllReduce):
        lay.send.copy_(torch.stack(rows).sum(0))
        codec.next_round(lay)
        lay.round2.mul_(len(rows))
    else:
        raise NotImplementedError(f"exchange pattern {type(ex).__name__}: the benchmark cannot fill its result")


def real_entries(lay: SendLayout) -> int:
    """Real (non-padding) entries of a layout's payloads; payloads without (idx, val) sections send all values."""
    return sum(sel.real_count(p["idx"], p["val"]) if "idx" in p and "val" in p else p.plan.values_sent
               for p in lay.payloads)


# ---- one compressor at one level ------------------------------------------------------------------------
def run_level(gs: GradSet, own: Rank, others: list[Rank], level: float) -> dict[str, Any]:
    comp, repeats = own.comp, gs.repeats
    own.memory.reset()
    send = {b: own.levels(b, level, 0) for b in own.compressible}
    fresh, out = gs.pass_now()
    members = [m for b in own.compressible for m in own.plan.buckets[b].members]
    res: dict[str, Any] = {"level": send[own.compressible[0]][0], "tensors": len(members),
                           "buckets": len(own.compressible), "t_pass_local": fresh, "t_pass_out_local": out}
    samples: dict[str, list[float]] = {k: [] for k in STEP_KEYS}
    for step in range(repeats + 1):
        t = own.step(send, step)
        if step > 0:
            for k in STEP_KEYS:
                samples[k].append(t[k])
    res.update({k: stats(v) for k, v in samples.items()})

    lays = {b: own.planner.codecs[b].layout(send[b]) for b in own.compressible}
    rows = {b: [lay.send.clone()] for b, lay in lays.items()}
    for other in others[:max(DECODE_NS) - 1]:
        for b, p in other.payloads(send, repeats).items():
            rows[b].append(p)
    for n in DECODE_NS:
        exchanges = []
        for b in own.compressible:
            codec = BucketCodec(own.plan.buckets[b], comp, own.planner.ctxs[b])
            lay = codec.layout(send[b])
            ex = own.exchange(b, codec, lay, n)
            fill_received(ex, codec, lay, rows[b][:n])
            exchanges.append((own.memory.bucket(b), ex))
        scale = reduce_rule(n).output_scale
        res[f"t_decompress_n{n}"] = timed(lambda _: [ex.result(mem.scratch, scale) for mem, ex in exchanges],
                                          repeats)

    plans = [p for lay in lays.values() for p in lay.plans]
    compressed = sum(m.numel for m in members)
    res["payload_bytes"] = sum(comp.wire_bytes(p) for p in plans)
    res["values_sent"] = sum(comp.values_sent(p) for p in plans)
    res["real_entries"] = sum(real_entries(lay) for lay in lays.values())
    res["compressed_numel"] = compressed
    res["wire_cf"] = 4 * compressed / max(1, res["payload_bytes"])
    res["gbps_compress"] = 4 * compressed / res["t_compress"]["median"] / 1e9
    res["passes"] = {k: gs.passes(res[k], res["t_pass_local"]) for k in PHASES}
    res["passes_out"] = {k: gs.passes(res[k], res["t_pass_out_local"]) for k in PHASES}
    res["passes_vs_set_t_pass"] = {k: gs.passes(res[k]) for k in PHASES}
    return res


# ---- extra memory -----------------------------------------------------------------------------------------
def dense_classified(own: Rank) -> dict[str, Any]:
    """Dense-classified tensors: no ds_gravac buffer; ``DenseAllReduce`` flattens each of their buckets as DeepSpeed
    does (a transient copy, plus a cast copy when the communication dtype differs), held until the step's end."""
    dense = [b for b in own.plan.buckets if not b.compressible]
    flat = sum(b.numel * torch.empty((), dtype=b.dtype).element_size() for b in dense)
    return {"tensors": sum(len(b.members) for b in dense), "buckets": len(dense),
            "numel": sum(b.numel for b in dense), "flatten_transient_bytes": flat, "extra_bytes": 0}


def memory_row(gs: GradSet, own: Rank, send_level: float, probes: tuple[float, ...], n: int,
               step: int) -> dict[str, Any]:
    """Extra bytes of one rank for one step at world size ``n`` (see the module docstring)."""
    comp = own.comp
    slots: dict[str, int] = {}
    for bm in own.memory.buckets.values():
        for name, buf in bm.slots.items():
            slots[name] = slots.get(name, 0) + nbytes(buf)
    scratch = sum(nbytes(bm.scratch) for bm in own.memory.buckets.values())
    send_b = probe_b = recv_b = bulk_b = decode_peak = fallback = 0
    for b in own.compressible:
        bucket = own.plan.buckets[b]
        codec = BucketCodec(bucket, comp, own.planner.ctxs[b])
        levels = own.levels(b, send_level, step)
        dense = own.falls_back(codec, levels, n)
        live = [not own.falls_back(codec, (p,) * len(bucket.members), n) for p in probes]
        fallback += int(dense)
        if dense and not probes:
            continue
        lay, _ = codec.encode(own.stage(b, step), None if dense else levels, probes, live)
        before = codec.nbytes()
        if lay is not None:
            own.exchange(b, codec, lay, n)
            send_b += nbytes(lay.send)
            bulk_b += sum(nbytes(t) for t in (lay.bulk_idx_pos, lay.bulk_val_pos, lay.bulk_offsets))
            if own.cfg.bulk and lay.bulk_idx_pos is not None and issubclass(own.pattern, PayloadAllGather):
                decode_peak = max(decode_peak, 12 * n * lay.bulk_idx_pos.numel())
        probe_b += before - (nbytes(lay.send) if lay is not None else 0)
        recv_b += codec.nbytes() - before
    memory_b = own.memory.nbytes()
    assert memory_b == sum(slots.values()) + scratch
    extra = memory_b + send_b + probe_b + recv_b
    cache_b = held_tensor_bytes(comp)
    g = gs.grad_bytes
    x = {"memory": memory_b / g, "codec": (send_b + probe_b) / g, "recv": recv_b / g, "total": extra / g}
    return {"world_size": n, "send_level": send_level, "probes": list(probes), "grad_bytes": g,
            "memory_bytes": memory_b, "memory_slot_bytes": slots, "memory_scratch_bytes": scratch,
            "codec_send_bytes": send_b, "codec_probe_bytes": probe_b, "recv_bytes": recv_b, "extra_bytes": extra,
            "x": x, "target_x": TARGET_EXTRA_X, "within_target": x["total"] <= TARGET_EXTRA_X,
            "fallback_buckets": fallback,
            "uncounted": {"bulk_index_bytes": bulk_b, "compressor_tensor_bytes": cache_b,
                          "decode_transient_peak_bytes_est": decode_peak},
            "x_incl_uncounted": (extra + bulk_b + cache_b) / g, "dense_classified": dense_classified(own)}


def memory_rows(gs: GradSet, own: Rank, levels: list[float]) -> list[dict[str, Any]]:
    """Send-only rows per level, and (CF compressors) the 5-level search row, at every N of ``MEMORY_NS``."""
    comp = own.comp
    cases: list[tuple[float, tuple[float, ...]]] = [(lv, ()) for lv in levels]
    if comp.level_kind == "cf":
        cases.append((SEARCH_SEND, tuple(float(comp.realize_cf(p)) for p in SEARCH_PROBES)))
    out = []
    step = 1_000_000          # a step number of its own per row: caches keyed by step start empty
    for n in MEMORY_NS:
        for send_level, probes in cases:
            step += 1
            out.append(memory_row(gs, own, send_level, probes, n, step))
    return out


# ---- reference lines and multi-level ------------------------------------------------------------------
def naive_topk(gs: GradSet, level: float) -> dict[str, Any]:
    def run(_: int) -> None:
        for x in gs.grads:
            idx = torch.topk(x.abs(), k_for(level, x.numel()), sorted=False).indices
            x.index_select(0, idx)
    ref, ref_out = gs.pass_now()
    t = timed(run, gs.repeats)
    return {"level": level, "t": t, "t_pass_local": ref, "t_pass_out_local": ref_out, "passes": gs.passes(t, ref),
            "passes_out": gs.passes(t, ref_out)}


def sampled_threshold(gs: GradSet, level: float, ratio: float = 0.01) -> dict[str, Any]:
    def run(step: int) -> None:
        gen = torch.Generator().manual_seed(step)
        for x in gs.grads:
            s = max(1, math.ceil(ratio * x.numel()))
            sample = x.index_select(0, torch.randint(x.numel(), (s,), generator=gen)).abs_()
            torch.topk(sample, max(1, math.ceil(s / level)), sorted=False).values.min()
    ref, ref_out = gs.pass_now()
    t = timed(run, gs.repeats)
    return {"level": level, "sample_ratio": ratio, "t": t, "t_pass_local": ref, "t_pass_out_local": ref_out,
            "passes": gs.passes(t, ref), "passes_out": gs.passes(t, ref_out)}


def multilevel(gs: GradSet, own: Rank, levels: list[float], direct_send: dict[float, float]) -> dict[str, Any]:
    """Probe encodes of every compressible bucket on the staged inputs: all levels in one encode (levels[0]
    compressed, the others derived from it) against each level in an encode of its own; ``t_stage`` of a derived
    level = (encode of levels[0] and it) − (encode of levels[0] alone), per sample."""
    xs = {b: own.stage(b, 2_000_000) for b in own.compressible}
    codecs = own.planner.codecs

    def encode(probes: tuple[float, ...]) -> float:
        t0 = time.perf_counter()
        for b in own.compressible:
            codecs[b].encode(xs[b], None, probes, [True] * len(probes))
        return time.perf_counter() - t0

    base, rest = levels[0], levels[1:]
    t_direct: dict[float, list[float]] = {lv: [] for lv in levels}
    t_pair: dict[float, list[float]] = {lv: [] for lv in rest}
    t_stage2: dict[float, list[float]] = {lv: [] for lv in rest}
    t_all: list[float] = []
    for i in range(gs.repeats + 1):
        d = {lv: encode((lv,)) for lv in levels}
        pair = {lv: encode((base, lv)) for lv in rest}
        every = encode(tuple(levels))
        if i > 0:
            for lv in levels:
                t_direct[lv].append(d[lv])
            for lv in rest:
                t_pair[lv].append(pair[lv])
                t_stage2[lv].append(pair[lv] - d[base])
            t_all.append(every)
    for codec in codecs.values():
        codec.end_step()
    direct = {lv: stats(v)["median"] for lv, v in t_direct.items()}
    t_stage = {str(base): stats(t_direct[base]), **{str(lv): stats(v) for lv, v in t_stage2.items()}}
    multi, direct_total = stats(t_all)["median"], sum(direct.values())
    pairs = {f"{base:g}+{lv:g}": {"direct": direct[base] + direct[lv], "multi": stats(t_pair[lv])["median"]}
             for lv in rest}
    for p in pairs.values():
        p["ratio"] = p["multi"] / p["direct"]
    return {"levels": levels, "t_stage": t_stage, "t_multi": multi, "t_direct": direct_total,
            "ratio": multi / direct_total, "pairs": pairs,
            "t_direct_send": sum(direct_send[lv] for lv in levels)}


# ---- driver ---------------------------------------------------------------------------------------------
def compressor_variants(names: list[str], algorithms: Sequence[str], ranks: Sequence[int] = LOWRANK_RANKS
                        ) -> list[tuple[str, str, Compressor]]:
    """(label, registered name, instance); Top-k once per selection algorithm; ACP-SGD once per phase (its P-
    and Q-steps move different factors)."""
    out = []
    for name in names:
        cls = lookup(name)
        if name == "topk":
            out += [(f"topk[{a}]", name, cls(cls.Params(algorithm=a))) for a in algorithms]
        elif cls.level_kind == "rank":
            for phase in ((0, 1) if name == "acpsgd" else (0,)):
                comp = cls()
                comp.bind_levels("rank", float(max(ranks)))
                comp.phase = phase
                out.append((f"{name}[{'PQ'[phase]}]" if name == "acpsgd" else name, name, comp))
        else:
            out.append((name, name, cls()))
    return out


def levels_for(comp: Compressor, cfs: list[float], ranks: Sequence[int] = LOWRANK_RANKS) -> list[float]:
    """CF-continuous: the requested CFs; grids: the realizable values they snap to; low-rank: the ranks."""
    if comp.level_kind == "rank":
        return [float(r) for r in ranks]
    if comp.cf_grid() is None:
        return list(cfs)
    return sorted({comp.realize_cf(c) for c in cfs})


def bench_compressor(gs: GradSet, set_name: str, label: str, name: str, comp: Compressor, cfg: GravacConfig,
                     args: argparse.Namespace, report: dict[str, Any]) -> None:
    levels = levels_for(comp, args.cfs, args.ranks)
    if mq.handles(comp):      # quantizers (bucket partitions) and half casts: rows per N of their own
        return mq.bench(gs, set_name, label, name, comp, cfg, args, report)
    ranks = len(gs.rank_grads)
    own = Rank(gs, comp, 0, ranks, cfg)
    if not own.compressible:
        for level in levels:
            report["results"].append({"set": set_name, "compressor": label, "name": name, "level": level,
                                      "skipped": "accepts no tensor (sent dense)"})
        return
    others = [Rank(gs, fresh_compressor(comp), r, ranks, cfg) for r in range(1, ranks)]
    direct: dict[float, float] = {}
    for level in levels:
        try:
            res = run_level(gs, own, others, level)
        except Exception as exc:  # a compressor this generic driver cannot run: record, continue
            res = {"level": level, "error": f"{type(exc).__name__}: {exc}"}
        report["results"].append({"set": set_name, "compressor": label, "name": name, **res})
        if "t_compress" in res:
            direct[level] = res["t_compress"]["median"]
    del others
    ml_levels = [lv for lv in (10.0, 100.0, 1000.0) if lv in direct]
    if comp.multilevel != "none" and len(ml_levels) > 1 and "error" not in report["results"][-1]:
        report["multilevel"].append({"set": set_name, "compressor": label,
                                     **multilevel(gs, own, ml_levels, direct)})
    try:
        rows = memory_rows(gs, own, levels)
    except Exception as exc:
        rows = [{"error": f"{type(exc).__name__}: {exc}"}]
    report["memory"] += [{"set": set_name, "compressor": label, "name": name, **r} for r in rows]


def bench_set(set_name: str, args: argparse.Namespace, variants: list[tuple[str, str, Compressor]],
              report: dict[str, Any]) -> None:
    shapes = set_shapes(set_name, args.smoke)
    ranks = max(*DECODE_NS, *args.world_sizes)
    if args.source == "real" and not args.smoke:
        rank_grads = [real_grads(set_name, args.seed + r) for r in range(ranks)]
    else:
        rank_grads = [synthetic_grads(shapes, args.seed + r) for r in range(ranks)]
    gs = GradSet([n for n, _ in shapes], [s for _, s in shapes], rank_grads, args.repeats)
    cfg = GravacConfig(bucket_cap_mb=args.bucket_cap_mb, min_compress_numel=args.min_compress_numel, seed=args.seed)
    info = {"numel": gs.numel, "tensors": len(gs.grads), "grad_bytes": gs.grad_bytes, "t_pass": gs.t_pass,
            "t_pass_out": gs.t_pass_out, "compute_ref_s": COMPUTE_REF_S[set_name]}
    if args.measure_compute and not args.smoke:
        info["t_compute"] = measure_compute(set_name, args.repeats)
    report["sets"][set_name] = info
    for level in args.cfs:
        report["naive_topk"].append({"set": set_name, **naive_topk(gs, level)})
        report["sampled_threshold"].append({"set": set_name, **sampled_threshold(gs, level)})
    for label, name, comp in variants:
        bench_compressor(gs, set_name, label, name, comp, cfg, args, report)


def environment() -> dict[str, Any]:
    def version(pkg: str) -> Optional[str]:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"torch": torch.__version__, "deepspeed": version("deepspeed"), "numpy": version("numpy"),
            "torchvision": version("torchvision"), "python": platform.python_version(), "cpu_model": cpu,
            "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "git_commit": commit,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def print_table(report: dict[str, Any]) -> None:
    ms = 1e3
    for set_name, info in report["sets"].items():
        print(f"\n== {set_name}: {info['numel'] / 1e6:.1f}M elements in {info['tensors']} tensors, "
              f"t_pass {info['t_pass']['median'] * ms:.1f} ms (x.abs()), "
              f"{info['t_pass_out']['median'] * ms:.1f} ms (abs into preallocated buffers)")
        print(f"{'compressor':<18}{'level':>7}{'payload MB':>11}{'compress ms':>13}{'passes':>8}{'p/out':>7}"
              f"{'dec2 ms':>9}{'dec4 ms':>9}{'resid ms':>9}{'stage ms':>9}{'norm ms':>9}{'GB/s':>7}")
        for r in (r for r in report["results"] if r["set"] == set_name and "world_size" not in r):
            if "t_compress" not in r:
                print(f"{r['compressor']:<18}{r.get('level', 0):>7g}  {r.get('error') or r.get('skipped')}")
                continue
            print(f"{r['compressor']:<18}{r['level']:>7g}{r['payload_bytes'] / 2**20:>11.2f}"
                  f"{r['t_compress']['median'] * ms:>13.1f}{r['passes']['t_compress']:>8.2f}"
                  f"{r['passes_out']['t_compress']:>7.2f}"
                  f"{r['t_decompress_n2']['median'] * ms:>9.1f}{r['t_decompress_n4']['median'] * ms:>9.1f}"
                  f"{r['t_residual']['median'] * ms:>9.1f}{r['t_stage']['median'] * ms:>9.1f}"
                  f"{r['t_norm']['median'] * ms:>9.1f}{r['gbps_compress']:>7.2f}")
        print("passes (t / t_pass) per phase: stage, norm, compress, round 2, decode N=2, decode N=4, residual")
        for r in (r for r in report["results"] if r["set"] == set_name and "passes" in r and "world_size" not in r):
            print(f"{r['compressor']:<18}{r['level']:>7g}  " + "".join(f"{r['passes'][k]:>7.2f}" for k in PHASES))
        mq.print_rows(report, set_name)
        for key, label in (("naive_topk", "naive topk"), ("sampled_threshold", "1% sample thr")):
            for r in (r for r in report[key] if r["set"] == set_name):
                print(f"{label:<18}{r['level']:>7g}{'':>11}{r['t']['median'] * ms:>13.1f}{r['passes']:>8.2f}"
                      f"{r['passes_out']:>7.2f}")
        for r in (r for r in report["multilevel"] if r["set"] == set_name):
            print(f"multi-level {r['compressor']}: {' -> '.join(f'{lv:g}' for lv in r['levels'])}: "
                  f"{r['t_multi'] * ms:.1f} ms vs direct {r['t_direct'] * ms:.1f} ms (ratio {r['ratio']:.2f})")
        rows = [r for r in report["memory"] if r["set"] == set_name]
        if rows:
            print(f"extra memory per rank, x the model's fp32 gradient bytes ({info['grad_bytes'] / 2**20:.1f} MiB); "
                  f"target: Top-k with error feedback <= {TARGET_EXTRA_X:g} extra copies")
            print(f"{'compressor':<18}{'send':>6}  {'probes':<18}{'N':>3}{'memory':>8}{'codec':>7}{'recv':>7}"
                  f"{'total':>7}{'target':>8}   uncounted: {'bulk idx':>8}{'cache':>7}{'incl.':>7}"
                  f"{'dec peak':>9}  dense-classified")
        for r in rows:
            if "x" not in r:
                print(f"{r['compressor']:<18}  {r.get('error')}")
                continue
            x, u, g = r["x"], r["uncounted"], r["grad_bytes"]
            probes = ",".join(f"{p:g}" for p in r["probes"]) or "-"
            dc = r["dense_classified"]
            dense = f"{dc['tensors']} tensors, {dc['flatten_transient_bytes'] / g:.3f} transient" if dc["tensors"] \
                else "none"
            print(f"{r['compressor']:<18}{r['send_level']:>6g}  {probes:<18}{r['world_size']:>3}{x['memory']:>8.3f}"
                  f"{x['codec']:>7.3f}{x['recv']:>7.3f}{x['total']:>7.3f}"
                  f"{('<=' if r['within_target'] else '> ') + format(r['target_x'], 'g'):>8}   "
                  f"{'':>11}{u['bulk_index_bytes'] / g:>8.3f}{u['compressor_tensor_bytes'] / g:>7.3f}"
                  f"{r['x_incl_uncounted']:>7.3f}{u['decode_transient_peak_bytes_est'] / g:>9.3f}  {dense}")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS), help="comma list of resnet101, vgg16, lstm")
    ap.add_argument("--compressors", default="", help="comma list (default: every registered one)")
    ap.add_argument("--topk-algorithms", default=",".join(TOPK_ALGORITHMS))
    ap.add_argument("--cfs", default="10,100,1000", help="CFs for CF-continuous compressors")
    ap.add_argument("--ranks", default=",".join(map(str, LOWRANK_RANKS)), help="ranks for low-rank compressors")
    ap.add_argument("--world-sizes", default=",".join(map(str, DECODE_NS)), help="simulated N for quantizers")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--source", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=float, default=None,
                    help=f"bucket cap of the plan (default: the config's 25; {SMOKE_BUCKET_CAP_MB} with --smoke)")
    ap.add_argument("--min-compress-numel", type=int, default=0, help="tensors below it are dense-classified")
    ap.add_argument("--measure-compute", action="store_true", help="also time each model's forward+backward")
    ap.add_argument("--smoke", action="store_true", help="10^5-element sets, 1 repeat")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    unknown = set(args.sets) - set(SETS)
    if unknown:
        ap.error(f"unknown set(s): {', '.join(sorted(unknown))}")
    args.cfs = [float(c) for c in args.cfs.split(",") if c]
    args.ranks, args.world_sizes = ([int(r) for r in v.split(",") if r] for v in (args.ranks, args.world_sizes))
    args.compressors = [c for c in args.compressors.split(",") if c] or registered_names()
    args.topk_algorithms = [a for a in args.topk_algorithms.split(",") if a]
    if args.smoke:
        args.repeats = 1
    if args.bucket_cap_mb is None:
        args.bucket_cap_mb = SMOKE_BUCKET_CAP_MB if args.smoke else float(GravacConfig().bucket_cap_mb)
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    variants = compressor_variants(args.compressors, args.topk_algorithms, args.ranks)
    report: dict[str, Any] = {
        "env": environment(),
        "config": {"sets": args.sets, "compressors": [v[0] for v in variants], "cfs": args.cfs,
                   "repeats": args.repeats, "smoke": args.smoke, "source": args.source, "seed": args.seed,
                   "path": "production codec (Planner, BucketCodec, ErrorFeedbackMemory, exchange patterns)",
                   "bucket_cap_mb": args.bucket_cap_mb, "min_compress_numel": args.min_compress_numel,
                   "optimizer": OPTIMIZER, "decode_ns": list(DECODE_NS),
                   "decode_rows": "N different seeded gradient sets (seed + rank), each encoded by its own rank's "
                                  "planner/codec/memory; row 0 = rank 0's payload of its last timed step",
                   "memory_ns": list(MEMORY_NS), "search": {"send": SEARCH_SEND, "probes": list(SEARCH_PROBES)},
                   "memory_target_x": TARGET_EXTRA_X},
        "sets": {}, "results": [], "naive_topk": [], "sampled_threshold": [], "multilevel": [], "memory": []}
    for set_name in args.sets:
        bench_set(set_name, args, variants, report)
    print_table(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report

from . import micro_quantizers as mq  # noqa: E402  (it imports this module's helpers, so it comes last)

if __name__ == "__main__":
    main()
