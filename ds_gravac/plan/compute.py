"""What attach would do with an engine's config, computed on one process without a collective: the refusals it
would raise, the bucket plan, what each bucket sends at the first compressed step, and the cost model's
prediction of the exchange on a nominal link.

Every number comes from the code attach runs: :func:`~ds_gravac.sync.buckets.sync_members` and the
:class:`~ds_gravac.sync.planner.Planner` build the buckets and choose each bucket's action, the exchange
patterns count the bytes (``Exchange.bytes_sent``, as the step records do), and ``sync/cost_model/predict.py``
prices them with the α–β fits of :func:`~ds_gravac.adapt.auto.timing.link_fits`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..adapt import Controller, build_controller
from ..adapt.auto.timing import link_fits
from ..decision import Branch, StepDecision
from ..compress.base import Compressor
from ..compress.kinds import describe_level
from ..config import GravacConfig, parse_config
from ..errors import GravacConfigError, GravacError, GravacUnsupportedError
from ..integration.build import (build_compressor, check_optimizer_takeover, controller_context, exchange_rule,
                                 reject_unimplemented)
from ..integration.engine import _resolve_section, _trainable, ready_compressor
from ..integration.validation import validate_engine
from ..sync.aggregate_gain import check_aggregate_gain
from ..sync.buckets import Bucket, BucketPlan, sync_members
from ..sync.codec import SendLayout
from ..sync.collectives import ring_allreduce_bytes
from ..sync.cost_model.fits import ALL_REDUCE, FitTable
from ..sync.cost_model.predict import PRICED, compressed_time, dense_time
from ..sync.cost_model.selector import CostModelSelector, check_priceable, chunk_limit, exchange_candidates
from ..sync.exchange import DenseAllReduce, Exchange, chunk_spans, exchange_name, payload_exchange
from ..sync.exchange.base import Codec
from ..sync.memory import ErrorFeedbackMemory
from ..sync.planner import Planner
from ..sync.reduce_rule import ReduceRule
from ..sync.selection import Selector, ThresholdSelector
from ..sync.step_plan import BucketAction

REFUSALS = (GravacConfigError, GravacUnsupportedError, GravacError)


@dataclass
class BucketRow:
    """One bucket at the planned step: what it holds, what it sends, and its predicted wire seconds."""

    index: int
    tensors: int
    numel: int
    family: str                # the compressor's name, "dense" (classified dense) or "dense (fallback)"
    level: str
    exchange: str
    bytes_sent: float          # logical bytes one rank sends, all rounds (the step records' ``bytes_sent``)
    dense_bytes: float         # the ring all-reduce of the bucket in the communication dtype
    predicted_s: float
    predicted_dense_s: float


@dataclass
class Plan:
    """Everything ``python -m ds_gravac.plan`` prints."""

    world_size: int
    rate_bit_s: float
    alpha_s: float
    mode: str = ""
    compressor: str = ""
    selection: str = ""
    comm_dtype: str = ""
    step: int = 0                                   # the step whose actions the rows show
    start: str = ""                                 # what the controller starts with, in words
    rows: list[BucketRow] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_sent(self) -> float:
        return sum(r.bytes_sent for r in self.rows)

    @property
    def dense_bytes(self) -> float:
        return sum(r.dense_bytes for r in self.rows)

    @property
    def ratio(self) -> float:
        """Bytes sent per dense byte (1.0: dense)."""
        return self.bytes_sent / self.dense_bytes if self.dense_bytes else 1.0


def _attempt(plan: Plan, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """Run one of attach's checks; a refusal is recorded with attach's message and the plan goes on."""
    try:
        return True, fn(*args)
    except REFUSALS as exc:
        plan.refusals.append(str(exc))
        return False, None


def level_text(comp: Compressor, level: float) -> str:
    return describe_level(comp.kind, comp.level_kind, level)


def levels_text(comp: Compressor, levels: Sequence[float]) -> str:
    distinct = sorted(set(float(v) for v in levels))
    if len(distinct) == 1:
        return level_text(comp, distinct[0])
    return f"{level_text(comp, distinct[0])} .. {level_text(comp, distinct[-1])} (per tensor)"


def _selector(plan: Plan, cfg: GravacConfig, comp: Compressor, pattern: type[Exchange], rule: ReduceRule,
              fits: FitTable) -> Selector:
    """The threshold rules, or the cost model's choices from the nominal link's fits (at run time it chooses
    from the fits it measures at attach)."""
    threshold = ThresholdSelector(cfg, pattern, rule, plan.world_size)
    if cfg.selection != "cost_model" or cfg.mode == "dense" or comp.name == "none":
        return threshold
    candidates = exchange_candidates(cfg.quantized_exchange, comp)
    ok, _ = _attempt(plan, check_priceable, comp, candidates)
    if not ok:
        return threshold
    selector = CostModelSelector(cfg.cost_model.margin, candidates, rule, plan.world_size, threshold,
                                 chunk_limit(cfg, comp))
    selector.set_fits(fits)
    plan.notes.append("selection 'cost_model': dense or compressed per bucket as the nominal link prices it; at "
                      "run time from the fits measured at attach")
    return selector


def first_decision(cfg: GravacConfig, controller: Controller, plan: Plan) -> StepDecision:
    """The decision of the first step that may compress (step 0 is always dense: it finds the backward
    order), described in ``plan.start``."""
    step = 1 + int(cfg.warmup_steps) if cfg.mode == "static" else int(getattr(controller, "i0", 1))
    if cfg.mode == "auto":
        controller.hold_reference()
    decision = controller.decide(step, math.nan)
    plan.step = step
    ctl: Any = controller          # the mode's own controller: its levels are named in ``plan.start``
    if cfg.mode == "dense":
        plan.start = "dense: every bucket, every step (DeepSpeed's averaging, overlapped with backward)"
    elif cfg.mode == "static":
        plan.start = f"static: one level from step {step} on, dense before; it does not change at run time"
    elif cfg.mode == "gravac":
        decision = StepDecision(step=step, branch=Branch.MIN, send_level=float(ctl.theta_min))
        plan.start = (f"gravac: dense until the gains are measured, then theta_min {ctl.theta_min:g} (shown); the "
                      f"CF changes at run time (candidates from {ctl.theta_c:g} up, or dense)")
    elif cfg.mode == "accordion":
        plan.start = (f"accordion: every tensor starts at the low compression level {ctl.low:g} (shown) and "
                      f"switches per tensor between {ctl.low:g} and {ctl.high:g} at run time, every "
                      f"{cfg.accordion.interval_steps} steps")
    else:
        plan.start = (f"auto: the reference plan (shown), which bounds every plan's predicted step and error; at "
                      f"run time each layer group moves between dense and its ladder every "
                      f"{cfg.auto.interval_steps} steps, from measured error and time")
    return decision


def wire_seconds(fits: FitTable, name: str, bucket: Bucket, world_size: int, codec: Codec, action: BucketAction,
                 layout: SendLayout) -> float:
    """The cost model's seconds for a compressed bucket (``predict.compressed_time``); the two-round low-rank
    exchange, which it does not price, as its two all-reduces."""
    plans = codec.plans(action.levels)
    if name in PRICED:
        spans = chunk_spans([m.numel for m in bucket.members], action.chunks) if action.chunks > 1 else None
        return compressed_time(fits, name, bucket.numel, world_size, plans, spans)
    if name != "two_round":
        raise ValueError(f"ds_gravac: the plan cannot price the exchange pattern '{name}'")
    second = layout.round2.numel() if layout.round2 is not None else 0
    return fits.get(ALL_REDUCE)(4 * layout.words) + (fits.get(ALL_REDUCE)(4 * second) if second else 0.0)


def plan_engine(engine: Any, world_size: int, rate_bit_s: float, alpha_s: float) -> Plan:
    """Attach's checks and plan for ``engine`` (built on one process) as ``world_size`` ranks would run it."""
    plan = Plan(world_size=world_size, rate_bit_s=rate_bit_s, alpha_s=alpha_s)
    ok, cfg = _attempt(plan, lambda: parse_config(_resolve_section(engine, None)))
    if not ok:
        return plan
    plan.mode, plan.compressor, plan.selection = cfg.mode, cfg.compressor.type, cfg.selection
    if not cfg.enabled:
        plan.notes.append('"enabled": false: attach returns a passive handle and DeepSpeed keeps its all-reduce')
        return plan
    _attempt(plan, reject_unimplemented, cfg)
    ok, _ = _attempt(plan, validate_engine, engine)
    if not ok:          # e.g. ZeRO-3: its partitioned tensors would only add knock-on refusals
        return plan
    ok, comp = _attempt(plan, build_compressor, cfg)
    if not ok:
        return plan
    _attempt(plan, comp.check_engine, engine)
    named = _trainable(engine)
    _attempt(plan, ready_compressor, cfg, comp, named)
    rule = exchange_rule(cfg, engine, world_size)
    plan.comm_dtype = str(rule.comm_dtype).replace("torch.", "")
    ok, pattern = _attempt(plan, payload_exchange, comp, cfg.quantized_exchange, world_size)
    if not ok:
        return plan
    fits = FitTable(link_fits(rate_bit_s, alpha_s, world_size))
    selector = _selector(plan, cfg, comp, pattern, rule, fits)
    members = sync_members(named, cfg, comp)
    _attempt(plan, check_aggregate_gain, cfg, comp)
    ok, controller = _attempt(plan, build_controller, cfg)
    if not ok:
        return plan
    groups = controller.signal_groups([(m.name, tuple(m.param.shape)) for m in members if m.compressible])
    planner = Planner(engine, cfg, comp, members, ErrorFeedbackMemory(comp, cfg.error_feedback), pattern, rule,
                      0, world_size, None, selector,
                      bucket_groups=groups.members if groups is not None and groups.bucketed else None)
    planner.build(BucketPlan.provisional_order(len(members)), frozen=False)
    _attempt(plan, check_optimizer_takeover, cfg, comp, [m.name for m in members if not m.compressible],
             float(engine.gradient_clipping() or 0.0))
    compressible = tuple(m.name for m in members if m.compressible)
    ok, _ = _attempt(plan, controller.bind, controller_context(cfg, comp, engine, world_size, 0, compressible,
                                                               lambda: fits, rule=rule))
    if not ok:
        return plan
    decision = first_decision(cfg, controller, plan)
    if not decision.dense:
        sent = comp.realize_cf(decision.send_level)
        ramp = planner.level(decision.send_level, decision.step)
        if ramp != sent:
            plan.notes.append(f"'{comp.name}' ramps its level up during its own warm-up: step {decision.step} "
                              f"sends {level_text(comp, ramp)}, later steps {level_text(comp, sent)}")
    step_plan = planner.step_plan(decision.step, decision)
    own = exchange_name(comp, cfg.quantized_exchange, world_size)
    for bucket in planner.plan.buckets:
        row = _row(bucket, step_plan.actions[bucket.index], planner, rule, fits, comp, own)
        if bucket.compressible and row.family == "dense (fallback)" and decision.dense:
            row.family = "dense (controller)"
        plan.rows.append(row)
    return plan


def _row(bucket: Bucket, action: BucketAction, planner: Planner, rule: ReduceRule, fits: FitTable,
         comp: Compressor, own: str) -> BucketRow:
    """One bucket's row: the exchange attach would build for this action, and its predicted seconds."""
    n = planner.world_size
    dense_b = ring_allreduce_bytes(rule.engine_bytes_per_element * bucket.numel, n)
    pred_dense = dense_time(fits, bucket.numel, rule.comm_bytes_per_element)
    if action.compressed:
        codec = planner.codecs[bucket.index]
        layout = codec.layout(action.levels)
        name = action.exchange or own
        sent = planner.exchange(bucket.index, action, layout).bytes_sent
        chunks = f" x{action.chunks}" if action.chunks > 1 else ""
        return BucketRow(bucket.index, len(bucket.members), bucket.numel, comp.name,
                         levels_text(comp, action.levels), name + chunks, sent, dense_b,
                         wire_seconds(fits, name, bucket, n, codec, action, layout), pred_dense)
    flat = torch.zeros(bucket.numel, dtype=bucket.dtype)
    sent = DenseAllReduce(rule, n, f"bucket {bucket.index} (dense)", flat=flat).bytes_sent
    family = "dense (fallback)" if bucket.compressible else "dense"
    return BucketRow(bucket.index, len(bucket.members), bucket.numel, family, "-", "allreduce", sent, dense_b,
                     pred_dense, pred_dense)


__all__ = ["BucketRow", "Plan", "first_decision", "level_text", "plan_engine", "wire_seconds"]
