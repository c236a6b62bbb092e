"""The per-step state machine (synchronization.md §4): decision at the first boundary hook, in-order bucket
launches during backward, finish at the end of backward, stats exchange on ch0 for the next decision."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..compress.base import CompressCtx, Compressor, stable_hash
from ..errors import GravacError
from ..telemetry import stats as statvec
from .buckets import BucketPlan, Member, classify
from .collectives import Channels, Work, broadcast, check_agreement, ring_allreduce_bytes
from .compressed_path import BucketStepStats, CompressedBucket
from .dense_path import DenseReduce, ReduceRule

DEFERRED = "deferred"
DENSE = "dense"


@dataclass
class StepContext:
    """Everything about the running step; created at the decision point, dropped at the end of finish."""

    step: int
    decision: Any
    probes: tuple[float, ...]
    actions: list[Any]
    pending: list[int]
    next_b: int = 0
    stats: BucketStepStats = field(default_factory=BucketStepStats)
    dense_reds: dict[int, DenseReduce] = field(default_factory=dict)
    launch_t: dict[int, float] = field(default_factory=dict)
    t_begin: float = 0.0


class Synchronizer:
    """Takes over gradient averaging of one engine; owns plan, buffers, hooks and the running step."""

    def __init__(self, engine: Any, config: Any, compressor: Compressor, controller: Any, channels: Channels,
                 rule: ReduceRule, bucket_order: Optional[list[int]] = None, on_record: Any = None) -> None:
        self.engine, self.config, self.comp, self.controller = engine, config, compressor, controller
        self.channels, self.rule, self.on_record = channels, rule, on_record
        self.rank, self.world_size = channels.rank, channels.world_size
        named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad and p.numel() > 0]
        enabled = config.mode != "dense" and compressor.name != "none"
        self.members: list[Member] = classify(named, compressor.accepts, config.min_compress_numel, enabled)
        self.numel_total = sum(m.numel for m in self.members)
        self.cap = max(1, int(config.bucket_cap_mb * 2**20 / 4))
        self._group_of = _param_groups(engine)
        if bucket_order is not None and len(bucket_order) == len(self.members):
            self._build_plan(bucket_order, frozen=True)
        else:
            self._build_plan(BucketPlan.provisional_order(len(self.members)), frozen=False)
        self.ctx: Optional[StepContext] = None
        self._ready_order: list[int] = []
        self._pending_stats: Optional[tuple[Work, torch.Tensor, StepContext]] = None
        self._records: list[dict[str, Any]] = []
        self.last_record: dict[str, Any] = {}
        self.backward_end_t = 0.0
        self.last_launch_times: dict[int, float] = {}
        self._selection_digest: Optional[list[int]] = [] if callable(getattr(compressor, "indices", None)) else None
        self._opt_end_t: Optional[float] = None
        self._t_iter_last = 0.0
        self._t_gain_last = 0.0
        self._opt_hook = _register_step_hook(engine, self._on_optimizer_step)
        from .hooks import HookManager
        self.hooks = HookManager(engine, [m.param for m in self.members], self._begin, self._ready, self._finish)

    # ---- plan -------------------------------------------------------------------------------------------
    def _build_plan(self, order: list[int], frozen: bool) -> None:
        self.plan = BucketPlan(self.members, order, self.cap, frozen=frozen, compressor_type=self.comp.name)
        self.cbuckets: dict[int, CompressedBucket] = {
            b.index: CompressedBucket(b, self.comp, self.rank, self.world_size, self.config.seed,
                                      self.config.error_feedback, self._make_ctx)
            for b in self.plan.buckets if b.compressible}
        self._fallback_cache: dict[tuple[int, tuple[float, ...]], bool] = {}

    def _make_ctx(self, m: Member) -> CompressCtx:
        group = self._group_of.get(id(m.param), {})
        return CompressCtx(key=m.name, rank=self.rank, world_size=self.world_size, seed=self.config.seed,
                           param=m.param, lr=float(group.get("lr", 0.0)),
                           weight_decay=float(group.get("weight_decay", 0.0)),
                           momentum=float(group.get("momentum", 0.0)), error_feedback=self.config.error_feedback,
                           shape=tuple(m.param.shape))

    def _freeze_plan(self) -> None:
        """End of the discovery step: rank 0's readiness order becomes everyone's plan (§3)."""
        order = BucketPlan.complete_order(self._ready_order, len(self.members))
        t = torch.tensor(order, dtype=torch.int32)
        broadcast(t, 0, self.channels.control)
        self._build_plan([int(i) for i in t.tolist()], frozen=True)

    # ---- levels and actions -----------------------------------------------------------------------------
    def _level(self, level: float, step: int) -> float:
        return float(self.comp.effective_cf(self.comp.realize_cf(level), step))

    def _dense_at(self, b: int, levels: tuple[float, ...]) -> bool:
        """Whether bucket b is sent dense at these levels (the sparse break-even rule, §5.3)."""
        key = (b, levels)
        hit = self._fallback_cache.get(key)
        if hit is None:
            cb = self.cbuckets[b]
            hit = self.config.sparse_fallback and not cb.sparse_payload_pays(levels, self.rule)
            self._fallback_cache[key] = hit
        return hit

    def _actions(self, decision: Any, step: int) -> list[Any]:
        actions: list[Any] = []
        for b in self.plan.buckets:
            if not b.compressible:
                actions.append(None)
            elif decision.deferred:
                actions.append(DEFERRED)
            elif decision.dense:
                actions.append(DENSE)
            else:
                levels = tuple(self._level(decision.level_for(m.name), step) for m in b.members)
                actions.append(DENSE if self._dense_at(b.index, levels) else levels)
        return actions

    # ---- hook callbacks ---------------------------------------------------------------------------------
    def _begin(self) -> None:
        """Decision point of the step (pipelined: first boundary hook)."""
        t0 = time.perf_counter()
        self._collect_stats()
        step = int(self.engine.global_steps)
        lr = _current_lr(self.engine)
        if self.plan.frozen and self.controller.broadcast_point(step):
            size = self.controller.proposal_size()
            prop = self.controller.propose(step, lr) if self.rank == 0 else torch.zeros(size, dtype=torch.int64)
            prop = prop.to(torch.int64).reshape(size).clone()
            broadcast(prop, 0, self.channels.control)
            self.controller.accept(step, prop)
        interval = self.config.agreement_check_interval
        checksum = getattr(self.controller, "state_checksum", None)
        if interval and checksum is not None and step % interval == 0:
            check_agreement(int(checksum()), self.channels.control,
                            f"ranks hold different controller states at step {step} (agreement_check_interval)")
        decision = self.controller.decide(step, lr, force_dense=not self.plan.frozen)
        probes = tuple(float(self.comp.realize_cf(p)) for p in decision.probe_levels)
        self.ctx = StepContext(step=step, decision=decision, probes=probes, actions=self._actions(decision, step),
                               pending=[len(b.members) for b in self.plan.buckets], t_begin=t0)
        if self.config.debug.check_plans:
            check_agreement(stable_hash(repr((step, decision, self.ctx.actions))), self.channels.control,
                            f"ranks disagree on the plan of step {step}")

    def _ready(self, index: int) -> None:
        if not self.plan.frozen:
            self._ready_order.append(index)
        ctx = self.ctx
        ctx.pending[self.members[index].bucket] -= 1
        if self.config.overlap:
            self._launch_prefix()

    def _launch_prefix(self) -> None:
        ctx = self.ctx
        while ctx.next_b < len(ctx.pending) and ctx.pending[ctx.next_b] <= 0:
            self._launch(ctx.next_b)
            ctx.next_b += 1

    def _probe_fallback(self, b: int) -> list[bool]:
        cb = self.cbuckets[b]
        return [self._dense_at(b, tuple(p for _ in cb.bucket.members)) for p in self.ctx.probes]

    def _launch(self, b: int) -> None:
        ctx, bucket = self.ctx, self.plan.buckets[b]
        ctx.launch_t[b] = time.perf_counter()
        st = ctx.stats
        if not bucket.compressible:
            grads = [m.param.grad for m in bucket.members]
            if ctx.probes:
                den = sum(float(torch.dot(g.view(-1).float(), g.view(-1).float())) for g in grads)
                st.den += den
                CompressedBucket.add_dense_probe_nums(None, ctx.probes, [True] * len(ctx.probes), den, st)
            red = DenseReduce(grads, self.rule, self.channels.data)
            st.bytes_sent += ring_allreduce_bytes(red.payload_bytes, self.world_size)
            st.values_sent += bucket.numel
            ctx.dense_reds[b] = red
            return
        cb = self.cbuckets[b]
        collect = self.controller.collect if self.controller.collects_gradients(ctx.step) else None
        den_before = st.den
        cb.stage(ctx.step, collect, self.config.gain_denominator == "raw", st)
        fallback = self._probe_fallback(b)
        cb.add_dense_probe_nums(ctx.probes, fallback, st.den - den_before, st)
        action = ctx.actions[b]
        if action == DEFERRED or action == DENSE:
            if ctx.probes:
                cb.encode(None, ctx.probes, fallback, st)
            if action == DENSE:
                cb.launch_dense(self.rule, self.channels.data, st)
        else:
            cb.launch_compressed(cb.encode(action, ctx.probes, fallback, st), self.channels.data, st)
            if self._selection_digest is not None:
                self._selection_digest.append(self._shared_selection_digest(cb, action))

    def _shared_selection_digest(self, cb: CompressedBucket, levels: tuple[float, ...]) -> int:
        """Checksum of shared-stream selections (Random-k indices) of one bucket (compressors.md §3.3)."""
        total = 0
        for mem, ctx, lvl in zip(cb.bucket.members, cb.ctxs, levels):
            idx = self.comp.indices(mem.numel, self.comp.plan(mem.numel, lvl), ctx)
            total = stable_hash(f"{total}:{int(idx.long().sum())}:{int((idx.long() * 2654435761 % 1000003).sum())}")
        return total

    def _check_shared_selection(self) -> None:
        """At the first compressed step: fail fast if ranks drew different shared indices (a seed/RNG mismatch)."""
        digests, self._selection_digest = self._selection_digest, None
        check_agreement(stable_hash(repr(digests)), self.channels.control,
                        "ranks selected different Random-k indices at the first compressed step (the shared "
                        "random stream differs: check that every rank uses the same seed and library versions)")

    def _finish(self) -> None:
        """End of the boundary backward: launch the rest, wait in plan order, write every ``p.grad``."""
        ctx = self.ctx
        t0 = self.backward_end_t = time.perf_counter()
        for m in self.members:
            if m.param.grad is None:
                m.param.grad = torch.zeros_like(m.param)
            elif m.param.grad.is_sparse:
                raise GravacError(f"ds_gravac: sparse gradients (e.g. nn.Embedding(sparse=True)) are not "
                                  f"supported (parameter '{m.name}')")
        ctx.pending = [0] * len(ctx.pending)
        self._launch_prefix()
        if self._selection_digest and any(isinstance(a, tuple) for a in ctx.actions):
            self._check_shared_selection()
        if ctx.decision.deferred:
            self._resolve_strict()
        comm_wait = decompress = writeback = 0.0
        for b in self.plan.buckets:
            if b.compressible:
                w, d, wb = self.cbuckets[b.index].finish(self.rule.output_scale, self.config.bulk)
            else:
                red = ctx.dense_reds.pop(b.index)
                w = red.wait()
                t1 = time.perf_counter()
                red.write_back([m.param.grad for m in b.members])
                d, wb = 0.0, time.perf_counter() - t1
            comm_wait, decompress, writeback = comm_wait + w, decompress + d, writeback + wb
        self.last_launch_times = dict(ctx.launch_t)
        if not self.plan.frozen:
            self._freeze_plan()
        st = ctx.stats
        timings = {"stage_s": st.stage_s, "compress_s": st.compress_s, "decompress_s": decompress,
                   "comm_wait_s": comm_wait, "writeback_s": writeback, "finish_s": time.perf_counter() - t0}
        self._publish(ctx, timings)
        self.ctx = None

    def _resolve_strict(self) -> None:
        """Strict decision (gravac.md §6): blocking pre-send exchange, resolve, then send in plan order."""
        ctx = self.ctx
        rows = self._exchange(ctx, {}, async_op=False)[1]
        agreed = self._agreed(ctx, rows)
        self.controller.observe(agreed)
        final = self.controller.resolve(ctx.decision, agreed)
        ctx.decision = final
        actions = self._actions(final, ctx.step)
        for b in self.plan.buckets:
            if b.compressible:
                cb, st = self.cbuckets[b.index], ctx.stats
                if actions[b.index] == DENSE:
                    cb.launch_dense(self.rule, self.channels.data, st)
                else:
                    cb.launch_compressed(cb.encode(actions[b.index], (), (), st), self.channels.data, st)
        ctx.actions = actions

    # ---- stats --------------------------------------------------------------------------------------------
    def _exchange(self, ctx: StepContext, timings: dict[str, float], async_op: bool
                  ) -> tuple[Optional[Work], torch.Tensor]:
        st = ctx.stats
        vals = {"den": st.den, "den_raw": st.den_raw, "values_sent": st.values_sent, "bytes_sent": st.bytes_sent,
                "nonfinite": st.nonfinite, "t_iter_prev": self._t_iter_last, "t_gain_prev": self._t_gain_last,
                **timings}
        vec = statvec.pack(vals, st.nums)
        rows = torch.zeros(self.world_size * statvec.LENGTH, dtype=torch.float64)
        from .collectives import all_gather_async
        work = all_gather_async(rows, vec, self.channels.control)
        if not async_op:
            work.wait()
            return None, rows
        return work, rows

    def _agreed(self, ctx: StepContext, rows: torch.Tensor) -> Any:
        from ..adapt.base import AgreedStats   # data class only; decisions stay in the controller
        red = statvec.reduce_rows(rows.view(self.world_size, statvec.LENGTH), len(ctx.probes))
        s, n = red.sums, self.world_size
        self._last_maxima = red.maxima
        return AgreedStats(step=ctx.step, decision=ctx.decision, den=s["den"], den_raw=s["den_raw"],
                           nums=red.nums, t_iter_prev=s["t_iter_prev"] / n, t_gain_prev=s["t_gain_prev"] / n,
                           values_sent=s["values_sent"], bytes_sent=s["bytes_sent"], nonfinite=s["nonfinite"],
                           world_size=n)

    def _collect_stats(self) -> None:
        """Wait for the previous step's exchange and feed it to the controller (pipelined mode)."""
        if self._pending_stats is None:
            return
        work, rows, ctx = self._pending_stats
        self._pending_stats = None
        work.wait()
        agreed = self._agreed(ctx, rows)
        if not ctx.decision.deferred:
            self.controller.observe(agreed)
        rec = next((r for r in reversed(self._records) if r["step"] == ctx.step), None)
        if rec is not None:
            rec.update({f"{k}_max": v for k, v in self._last_maxima.items()})
            if ctx.probes and agreed.den > 0:
                rec.update({f"gain_raw@{p:g}": num / agreed.den for p, num in zip(ctx.probes, agreed.nums)})

    def _publish(self, ctx: StepContext, timings: dict[str, float]) -> None:
        st = ctx.stats
        self._t_gain_last = st.probe_s
        if not ctx.decision.deferred:
            work, rows = self._exchange(ctx, timings, async_op=True)
            self._pending_stats = (work, rows, ctx)
        d = self.numel_total
        compressed_numel = sum(self.cbuckets[b].bucket.numel for b, a in enumerate(ctx.actions)
                               if isinstance(a, tuple))
        dense_values = sum(self.plan.buckets[b].numel for b, a in enumerate(ctx.actions) if not isinstance(a, tuple))
        payload = sum(4 * self.cbuckets[b].layout(a).words for b, a in enumerate(ctx.actions) if isinstance(a, tuple))
        payload += dense_values * self.rule.comm_bytes_per_element
        rec = statvec.step_record(
            step=ctx.step, mode=self.config.mode, branch=ctx.decision.branch,
            cf_sent=ctx.decision.send_level, numel_total=d, values_sent=st.values_sent,
            bytes_sent=st.bytes_sent, dense_bytes=ring_allreduce_bytes(4 * d, self.world_size),
            payload_bytes=payload, compressed_numel=compressed_numel,
            compressed_values=st.values_sent - dense_values, nonfinite=st.nonfinite,
            t_iter_prev=self._t_iter_last, probe_s=st.probe_s, **timings, **self.controller.telemetry())
        self.last_record = rec
        self._records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)

    def pop_records(self) -> list[dict[str, Any]]:
        recs, self._records = self._records, []
        return recs

    def _on_optimizer_step(self, *_: Any) -> None:
        now = time.perf_counter()
        if self._opt_end_t is not None:
            self._t_iter_last = now - self._opt_end_t
        self._opt_end_t = now

    # ---- lifecycle ----------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Wait for the pending ch0 exchange (checkpoint, detach, exit) and apply it."""
        self._collect_stats()

    def reset_memory(self) -> None:
        for cb in self.cbuckets.values():
            cb.reset_memory()

    def close(self) -> None:
        self.drain()
        self.hooks.remove()
        if self._opt_hook is not None:
            self._opt_hook.remove()


def _param_groups(engine: Any) -> dict[int, dict[str, Any]]:
    """Snapshot of each parameter's group hyper-parameters at attach (before DGC zeroes momentum/wd)."""
    groups: dict[int, dict[str, Any]] = {}
    opt = getattr(engine, "basic_optimizer", None) or getattr(engine, "optimizer", None)
    for g in getattr(opt, "param_groups", []) or []:
        snap = {k: g[k] for k in ("lr", "weight_decay", "momentum") if k in g}
        for p in g["params"]:
            groups[id(p)] = snap
    return groups


def _register_step_hook(engine: Any, fn: Any) -> Any:
    opt = getattr(engine, "basic_optimizer", None)
    if isinstance(opt, torch.optim.Optimizer):
        return opt.register_step_post_hook(fn)
    return None


def _current_lr(engine: Any) -> float:
    try:
        return float(engine.get_lr()[0])
    except Exception:   # no optimizer (inference-only engines): LR never drives a decision then
        return 0.0
