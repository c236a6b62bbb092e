"""One simulated rank of the micro-benchmark, built from the synchronizer's own objects (planner, bucket plan,
codecs, error-feedback memory) so the timed steps run the production codec path and nothing copied of it."""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress.base import Compressor
from ds_gravac.config import GravacConfig
from ds_gravac.sync.buckets import BucketPlan, classify
from ds_gravac.sync.codec import BucketCodec, SendLayout
from ds_gravac.sync.exchange import (Exchange, PayloadAllGather, PayloadAllReduce, TwoRoundAllReduce,
    payload_exchange)
from ds_gravac.sync.memory import ErrorFeedbackMemory
from ds_gravac.sync.planner import Planner
from ds_gravac.sync.reduce_rule import ReduceRule

from .micro_grads import GradSet
from .micro_settings import OPTIMIZER, STEP_KEYS


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
