"""Turns the controller's decision into the step plan: the bucket plan, each compressible bucket's codec and
compression contexts, and one typed action per bucket — from agreed values only (config, step, decision, the
frozen bucket plan), so every rank plans the same collectives."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from ..compress.base import CompressCtx, Compressor, Kind
from ..config import GravacConfig
from .buckets import BucketPlan, Member
from .codec import BucketCodec
from .memory import ErrorFeedbackMemory
from .partition_codec import PartitionCodec
from .reduce_rule import ReduceRule
from .server_memory import ServerResiduals
from .step_plan import DEFERRED, DENSE, BucketAction, StepPlan, compress

if TYPE_CHECKING:
    from ..adapt.base import StepDecision


class Planner:
    """Bucket plan, codecs and per-step actions of one engine."""

    def __init__(self, engine: Any, config: GravacConfig, compressor: Compressor, members: list[Member],
                 memory: ErrorFeedbackMemory, pattern: Any, rule: ReduceRule, rank: int, world_size: int,
                 server: Optional[ServerResiduals] = None) -> None:
        self.config, self.comp, self.members, self.memory = config, compressor, members, memory
        self.server = server if server is not None else ServerResiduals(False, world_size)   # quantizers' owner state
        self.pattern, self.rule, self.rank, self.world_size = pattern, rule, rank, world_size
        self.cap = max(1, int(config.bucket_cap_mb * 2**20 / 4))
        self._group_of = _param_groups(engine)

    # ---- the bucket plan ----------------------------------------------------------------------------------
    def build(self, order: list[int], frozen: bool) -> None:
        self.plan = BucketPlan(self.members, [int(i) for i in order], self.cap, frozen=frozen,
                               compressor_type=self.comp.name)
        compressible = [b for b in self.plan.buckets if b.compressible]
        self.ctxs = {b.index: [self._make_ctx(m) for m in b.members] for b in compressible}
        if self.comp.kind == Kind.QUANTIZED:      # quantizers encode bucket partitions, not tensors
            self.codecs = {b.index: PartitionCodec(b, self.comp, self.ctxs[b.index], self.world_size, self.server)
                           for b in compressible}
        else:
            self.codecs = {b.index: BucketCodec(b, self.comp, self.ctxs[b.index]) for b in compressible}
        self.memory.build(compressible)
        self.server.build(compressible, self.plan.layout_signature())
        self._fallback_cache: dict[tuple[int, tuple[float, ...], int], bool] = {}

    def _make_ctx(self, m: Member) -> CompressCtx:
        group = self._group_of.get(id(m.param), {})
        return CompressCtx(key=m.name, rank=self.rank, world_size=self.world_size, seed=self.config.seed,
                           param=m.param, lr=float(group.get("lr", 0.0)),
                           weight_decay=float(group.get("weight_decay", 0.0)),
                           momentum=float(group.get("momentum", 0.0)), error_feedback=self.config.error_feedback,
                           shape=tuple(m.param.shape))

    # ---- actions ----------------------------------------------------------------------------------------
    def level(self, level: float, step: int) -> float:
        return float(self.comp.effective_cf(self.comp.realize_cf(level), step))

    def dense_at(self, b: int, levels: tuple[float, ...]) -> bool:
        """Whether bucket b goes dense at these levels because its pattern would move more bytes than dense."""
        key = (b, levels, self.comp.phase)
        hit = self._fallback_cache.get(key)
        if hit is None:
            codec = self.codecs[b]
            words = sum(p.words for p in codec.plans(levels))
            hit = self.config.sparse_fallback and not self.pattern.pays(words, codec.bucket.numel,
                                                                        self.world_size, self.rule)
            self._fallback_cache[key] = hit
        return hit

    def action(self, b: int, decision: "StepDecision", step: int) -> BucketAction:
        bucket = self.plan.buckets[b]
        if not bucket.compressible or decision.dense:
            return DENSE
        levels = tuple(self.comp.member_level(ctx, self.level(decision.level_for(m.name), step))
                       for m, ctx in zip(bucket.members, self.ctxs[b]))
        return DENSE if self.dense_at(b, levels) else compress(levels)

    def step_plan(self, step: int, decision: "StepDecision") -> StepPlan:
        probes = tuple(float(self.comp.realize_cf(p)) for p in decision.probe_levels)
        if decision.deferred:
            actions = tuple(DEFERRED if b.compressible else DENSE for b in self.plan.buckets)
        else:
            actions = tuple(self.action(b.index, decision, step) for b in self.plan.buckets)
        return StepPlan(step, decision, probes, actions, self.comp.phase)

    def resolved(self, plan: StepPlan, decision: "StepDecision") -> StepPlan:
        """Strict mode: the plan once the branch is chosen."""
        return plan.with_actions(decision, tuple(self.action(b.index, decision, plan.step)
                                                 for b in self.plan.buckets))

    def strict_candidates(self, plan: StepPlan, b: int) -> list[tuple[float, ...]]:
        """Level tuples a strict step may still send for bucket b (θ_min and θ_c): encoded straight into their
        send buffers, so the resolved branch is never compressed twice."""
        width = len(self.plan.buckets[b].members)
        out = []
        for p in plan.probes[:2]:
            levels = tuple(self.level(p, plan.step) for _ in range(width))
            if levels == (p,) * width and not self.dense_at(b, levels):
                out.append(levels)
        return out


def _param_groups(engine: Any) -> dict[int, dict[str, Any]]:
    """Snapshot of each parameter's group hyper-parameters at attach (before DGC zeroes momentum/wd)."""
    groups: dict[int, dict[str, Any]] = {}
    opt = getattr(engine, "basic_optimizer", None) or getattr(engine, "optimizer", None)
    for g in getattr(opt, "param_groups", []) or []:
        snap = {k: g[k] for k in ("lr", "weight_decay", "momentum") if k in g}
        for p in g["params"]:
            groups[id(p)] = snap
    return groups
