"""Turns the controller's decision into the step plan: the bucket plan, each compressible bucket's codec and
compression contexts, and one typed action per bucket — from agreed values only (config, step, decision, the
frozen bucket plan), so every rank plans the same collectives."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

from ..compress.base import CompressCtx, Compressor, Kind
from ..compress.kinds import PLAIN
from ..compress.optimizers import live_param_groups
from ..config import GravacConfig
from .buckets import BucketPlan, Member
from .codec import BucketCodec, SendLayout
from .exchange import PATTERNS, ChunkedExchange, Exchange, chunk_spans
from .memory import ErrorFeedbackMemory
from .partition_codec import PartitionCodec
from .reduce_rule import ReduceRule
from .selection import Choice, Selector, ThresholdSelector
from .server_memory import ServerResiduals
from .step_plan import DEFERRED, DENSE, ActionKind, BucketAction, StepPlan, compress

if TYPE_CHECKING:
    from ..decision import StepDecision


class Planner:
    """Bucket plan, codecs and per-step actions of one engine."""

    def __init__(self, engine: Any, config: GravacConfig, compressor: Compressor, members: list[Member],
                 memory: ErrorFeedbackMemory, pattern: type[Exchange], rule: ReduceRule, rank: int, world_size: int,
                 server: Optional[ServerResiduals] = None, selector: Optional[Selector] = None,
                 bucket_groups: Optional[dict[str, int]] = None) -> None:
        self.config, self.comp, self.members, self.memory = config, compressor, members, memory
        self.bucket_groups = bucket_groups      # a controller's layer groups that must not share a bucket
        self.server = server if server is not None else ServerResiduals(False, world_size)   # quantizers' owner state
        self.pattern, self.rule, self.rank, self.world_size = pattern, rule, rank, world_size
        self.selector = selector if selector is not None else ThresholdSelector(config, pattern, rule, world_size)
        # every pattern a bucket may use: later rounds are issued up to the largest round count
        candidates = getattr(self.selector, "candidates", ())
        self.max_rounds = max([pattern.rounds] + [PATTERNS[n].rounds for n in candidates])
        self.cap = max(1, int(config.bucket_cap_mb * 2**20 / 4))
        self._group_of = _param_groups(engine)

    # ---- the bucket plan ----------------------------------------------------------------------------------
    def build(self, order: list[int], frozen: bool) -> None:
        self.plan = BucketPlan(self.members, [int(i) for i in order], self.cap, frozen=frozen,
                               compressor_type=self.comp.name, groups=self.bucket_groups)
        compressible = [b for b in self.plan.buckets if b.compressible]
        self.ctxs = {b.index: [self._make_ctx(m) for m in b.members] for b in compressible}
        if self.comp.kind == Kind.QUANTIZED:      # quantizers encode bucket partitions, not tensors
            self.codecs = {b.index: PartitionCodec(b, self.comp, self.ctxs[b.index], self.world_size, self.server)
                           for b in compressible}
        else:
            self.codecs = {b.index: BucketCodec(b, self.comp, self.ctxs[b.index]) for b in compressible}
        self.memory.build(compressible)
        self.server.build(compressible, self.plan.layout_signature())
        self._choices: dict[tuple[int, tuple[float, ...], int, int], Choice] = {}

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

    def choice(self, b: int, levels: tuple[float, ...]) -> Choice:
        """The selector's answer for bucket b at these levels, cached per (levels, phase, selector version)."""
        key = (b, levels, self.comp.phase, self.selector.version)
        hit = self._choices.get(key)
        if hit is None:
            if self._choices and next(iter(self._choices))[3] != key[3]:
                self._choices.clear()                  # new fits: every earlier answer is stale
            hit = self._choices[key] = self.selector.choose(self.codecs[b], levels)
        return hit

    def dense_at(self, b: int, levels: tuple[float, ...]) -> bool:
        """Whether bucket b goes dense at these levels (its pattern would move more bytes than dense, or the
        cost model predicts no gain)."""
        return self.choice(b, levels).dense

    def pattern_of(self, action: BucketAction) -> type[Exchange]:
        """The exchange pattern class of a compressed bucket's action."""
        return PATTERNS[action.exchange] if action.exchange else self.pattern

    def exchange(self, b: int, action: BucketAction, lay: SendLayout) -> Exchange:
        """The exchange of compressed bucket b sending ``lay``: its pattern, whole or in the action's chunks."""
        if action.chunks > 1:
            return self.chunked(b, action, lay)
        return self.pattern_of(action)(self.codecs[b], lay, self.world_size, f"bucket {b} (compressed)",
                                       self.config.bulk)

    def chunked(self, b: int, action: BucketAction, lay: Optional[SendLayout] = None) -> ChunkedExchange:
        """Bucket b's pattern in the action's pipeline chunks (member groups of the frozen bucket plan, so the
        same on every rank), sending ``lay`` (default: the layout of the action's levels)."""
        codec = self.codecs[b]
        spans = chunk_spans([m.numel for m in codec.bucket.members], action.chunks)
        return ChunkedExchange(codec, lay if lay is not None else codec.layout(action.levels), action.levels,
                               self.pattern_of(action), spans, self.world_size, f"bucket {b} (compressed)",
                               self.config.bulk)

    def action(self, b: int, decision: "StepDecision", step: int) -> BucketAction:
        bucket = self.plan.buckets[b]
        if not bucket.compressible or decision.dense:
            return DENSE
        if self.bucket_groups is not None and any(decision.level_for(m.name) >= PLAIN for m in bucket.members):
            return DENSE      # a group of its own buckets (auto over a quantizer or a sparsifier) at the dense rung
        levels = tuple(self.comp.member_level(ctx, self.level(decision.level_for(m.name), step))
                       for m, ctx in zip(bucket.members, self.ctxs[b]))
        c = self.choice(b, levels)
        predicted = (c.pred_dense_s, c.pred_compressed_s) if math.isfinite(c.pred_dense_s) else None
        if c.dense:
            return DENSE if predicted is None else BucketAction(ActionKind.DENSE, predicted=predicted)
        return compress(levels, c.exchange, predicted, c.chunks)

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
    """Snapshot of each parameter's group hyper-parameters at attach (before DGC zeroes momentum/wd); found
    through DeepSpeed's bf16/fp16 wrappers, whose groups hold master copies instead of the module's parameters."""
    return {pid: {k: g[k] for k in ("lr", "weight_decay", "momentum") if k in g}
            for pid, g in live_param_groups(engine).items()}
