"""The scheduler of one engine's gradient synchronization: it orders launches, waits, and hands results back.

One step (one accumulation boundary):

1. The first boundary hook is the decision point: the controller decides from agreed values only, and the
   decision becomes a :class:`StepPlan` with one typed action per bucket.
2. As backward completes buckets, they launch strictly in plan order: the memory stages the compressor input,
   the codec encodes the sent level and the measured ones, and the bucket's exchange pattern issues its first
   collective on the first data channel. Nothing persistent changes yet.
3. At the end of backward the remaining buckets launch, further rounds of multi-round patterns are issued in plan
   order, and this step's statistics vector is exchanged on the control channel. It carries every rank's
   non-finite count, so all ranks learn together whether any gradient of the step was NaN/Inf.
4. Finite: every bucket's memory commits, its result is decoded and written to ``p.grad``
   (``ds_gravac.sync.completion``), and the controller observes the statistics. Not finite: nothing commits; the
   gradients are averaged exactly as plain DeepSpeed would (``nonfinite: "dense"``) or a :class:`GravacError`
   names the step and tensor (``"raise"``).

What a bucket does inside an exchange, and how payloads are encoded, is not this module's business: see
``ds_gravac.sync.exchange`` (patterns), ``ds_gravac.sync.codec`` (encode/decode) and ``ds_gravac.sync.memory``.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ..compress.base import Compressor, Kind
from ..config import GravacConfig
from ..errors import GravacError
from ..telemetry.stats import AgreedStats
from .aggregate_gain import AggregateGain, check_aggregate_gain
from .quant_variance import QuantVariance, VarianceSpec
from .sparse_unsent import SparseUnsent, UnsentSpec
from .buckets import BucketPlan, Member, sync_members
from .codec import BucketCodec, SendLayout
from .collectives import Channels, broadcast, check_agreement
from .completion import complete_step
from .exchange import DenseAllReduce, Exchange, payload_exchange
from .hooks import HookManager
from ..compress.local_clipping import clip_in_place
from .host_memory import release_freed_host_memory
from .memory import ErrorFeedbackMemory
from .planner import Planner
from .reduce_rule import ReduceRule
from .running_step import RunningStep
from .selector_factory import make_selector
from .selection_check import SharedSelectionCheck
from .server_memory import ServerResiduals
from .statistics import StepStatistics
from .streams import SideStreams
from .step_record import load_sync_state, step_record_of, sync_state_dict
from .step_plan import ActionKind, BucketAction
from .update_space import UpdateSpace

if TYPE_CHECKING:      # the synchronizer only carries decisions out; it never imports the controllers
    from ..adapt.base import Controller


class Synchronizer:
    """Takes over gradient averaging of one engine; owns plan, codecs, memory, hooks and the running step."""

    def __init__(self, engine: Any, config: GravacConfig, compressor: Compressor, controller: "Controller",
                 channels: Channels, rule: ReduceRule, bucket_order: Optional[list[int]] = None,
                 on_record: Optional[Callable[[dict[str, Any]], None]] = None) -> None:
        self.engine, self.config, self.comp, self.controller = engine, config, compressor, controller
        self.channels, self.rule, self.on_record = channels, rule, on_record
        self.rank, self.world_size = channels.rank, channels.world_size
        named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad and p.numel() > 0]
        self.members: list[Member] = sync_members(named, config, compressor)
        self.numel_total = sum(m.numel for m in self.members)
        self.pattern = payload_exchange(compressor, config.quantized_exchange, channels.world_size)
        self.memory = ErrorFeedbackMemory(compressor, config.error_feedback)
        self.update_space = UpdateSpace(engine, compressor, self.members)   # EF-signSGD: γ in, Δ/γ out
        self.partitioned = compressor.kind == Kind.QUANTIZED    # payloads per bucket partition, not per member
        self.server = ServerResiduals(self.partitioned and self.pattern.rounds > 1
                                      and compressor.server_error_feedback
                                      and (config.error_feedback or compressor.owns_state), channels.world_size)
        self.check_finite = config.mode != "dense" or config.nonfinite == "raise"
        selector = make_selector(config, compressor, self.pattern, rule, self.world_size, channels)
        check_aggregate_gain(config, compressor)
        groups = controller.signal_groups([(m.name, tuple(m.param.shape)) for m in self.members if m.compressible])
        self.planner = Planner(engine, config, compressor, self.members, self.memory, self.pattern, rule,
                               self.rank, self.world_size, self.server, selector,
                               bucket_groups=groups.members if groups is not None and groups.bucketed else None)
        if bucket_order is not None and len(bucket_order) == len(self.members):
            self.planner.build(bucket_order, frozen=True)
        else:
            self.planner.build(BucketPlan.provisional_order(len(self.members)), frozen=False)
        selector.prepare(self.planner)     # the cost model calibrates here: collectives on every rank, at attach
        self.running: Optional[RunningStep] = None
        self._ready_order: list[int] = []
        measured = groups is not None or (config.mode == "gravac" and config.gravac.gain_denominator == "aggregate")
        self.aggregate: Optional[AggregateGain | QuantVariance | SparseUnsent] = None
        if isinstance(groups, VarianceSpec):
            self.aggregate = QuantVariance(self.planner, groups, config.seed, self.world_size)
        elif isinstance(groups, UnsentSpec):
            self.aggregate = SparseUnsent(self.planner, groups, config.seed, self.world_size)
        elif measured:
            self.aggregate = AggregateGain(compressor, self.planner, config.seed, self.world_size, groups=groups)
        compressor.wants_energies = isinstance(self.aggregate, AggregateGain)
        self.sampled = self.aggregate       # the aggregate when this step is sampled, else None (``_begin``)
        self.stats = StepStatistics(engine, self.world_size, channels.control, on_record, self.aggregate)
        self.backward_end_t = 0.0
        self.last_launch_times: dict[int, float] = {}
        self.selection_check = SharedSelectionCheck(compressor, channels.control)
        self.loss_scale: Callable[[], float] = lambda: 1.0   # ZeRO-1/2 fp16: the optimizer's current scale
        self.local_clip = 0.0              # > 0: each gradient clipped per tensor to this norm (local_clipping.py)
        self.after_write: Optional[Callable[[], None]] = None  # ZeRO-1/2: hand the averaged p.grad to partitions
        self.streams = SideStreams()       # CUDA: launches on a side stream; elsewhere no-ops
        self.device = self.members[0].param.device if self.members else torch.device("cpu")
        self.hooks = HookManager(engine, [m.param for m in self.members], self._begin, self._ready, self._finish)

    # ---- plan -------------------------------------------------------------------------------------------
    @property
    def plan(self) -> BucketPlan:
        return self.planner.plan

    @property
    def codecs(self) -> dict[int, BucketCodec]:
        return self.planner.codecs

    def rebuild(self, order: list[int]) -> None:
        """Freeze a given bucket order (rank 0's, broadcast; or restored from a checkpoint)."""
        self.planner.build(order, frozen=True)

    def _freeze_plan(self) -> None:
        """End of the discovery step: rank 0's readiness order becomes everyone's plan."""
        order = BucketPlan.complete_order(self._ready_order, len(self.members))
        t = torch.tensor(order, dtype=torch.int32)
        broadcast(t, 0, self.channels.control, "broadcast of the bucket order")
        self.rebuild(t.tolist())
        check_agreement(self.plan.layout_signature(), self.channels.control,
                        "ranks built different bucket plans from rank 0's order (parameter lists differ)")

    # ---- hook callbacks ---------------------------------------------------------------------------------
    def _begin(self) -> None:
        """Decision point of the step (first boundary hook)."""
        t0 = time.perf_counter()
        step = int(self.engine.global_steps)
        self.server.discard()           # candidates of an unfinished step are never adopted
        if self.plan.frozen and self.controller.broadcast_point(step):
            self.controller.before_proposal(step)
            size = self.controller.proposal_size()
            prop = (self.controller.propose(step, self.stats.agreed_lr) if self.rank == 0
                else torch.zeros(size, dtype=torch.int64))
            prop = prop.to(torch.int64).reshape(size).clone()
            broadcast(prop, 0, self.channels.control, "broadcast of rank 0's decision")
            switched = self.controller.accept(step, prop)
            if switched and self.config.accordion.reset_ef_on_switch:
                self.memory.reset(switched)      # a new level starts with an empty error-feedback memory
        interval = self.config.debug.agreement_check_interval
        if interval and step % interval == 0:
            check_agreement(int(self.controller.state_checksum()), self.channels.control,
                            f"ranks hold different controller states at step {step} (agreement_check_interval)")
        decision = self.controller.decide(step, self.stats.agreed_lr, force_dense=not self.plan.frozen)
        self.comp.measuring = self.controller.measures(step)
        # the controller's signals are taken on the steps it reads (every step, unless it samples: auto)
        self.sampled = self.aggregate if self.comp.measuring else None
        plan = self.planner.step_plan(step, decision)
        self.running = RunningStep(plan=plan, pending=[len(b.members) for b in self.plan.buckets], t_begin=t0,
                                   loss_scale=float(self.loss_scale()))
        if self.sampled is not None:
            self.sampled.begin(step, plan)
        if self.config.debug.check_plans:
            check_agreement(plan.digest(), self.channels.control, f"ranks disagree on the plan of step {step}")

    def _ready(self, index: int) -> None:
        if not self.plan.frozen:
            self._ready_order.append(index)
        run = self.running
        run.pending[self.members[index].bucket] -= 1
        if self.config.overlap:
            self._launch_prefix()
            self._issue_later_rounds(block=False)

    def _launch_prefix(self) -> None:
        """Launch the ready buckets in plan order; with ``bulk``, buckets that one hook completed together are
        staged and encoded back to back and their collectives issued together after the last encode. On CUDA all of
        it runs on a side stream, overlapping the rest of backward (``sync/streams.py``)."""
        run = self.running
        if run.next_b >= len(run.pending) or run.pending[run.next_b] > 0:
            return
        grads = [m.param.grad for m in self.members] if self.device.type == "cuda" else ()
        with self.streams.launch(self.device, grads):
            while run.next_b < len(run.pending) and run.pending[run.next_b] <= 0:
                self._launch(run.next_b)
                run.next_b += 1
            self._issue_held()

    def _issue_held(self) -> None:
        for ex in self.running.held:
            ex.launch(self.channels.data_channels)
        self.running.held.clear()

    def _launch(self, b: int) -> None:
        run = self.running
        run.launch_t[b] = time.perf_counter()
        if self.plan.buckets[b].compressible:
            self._launch_compressible(b)
        else:
            self._launch_dense_classified(b)

    def _launch_dense_classified(self, b: int) -> None:
        run, bucket = self.running, self.plan.buckets[b]
        st, probes = run.stats, run.plan.probes
        if self.local_clip > 0.0:
            clip_in_place([m.param.grad for m in bucket.members], 1.0 / run.loss_scale, self.local_clip)
        ex = DenseAllReduce(self.rule, self.world_size, f"bucket {b} (dense)",
                            tensors=[m.param.grad for m in bucket.members])
        if probes or self.check_finite:
            flat = ex.flat if ex.flat.dtype in (torch.float32, torch.float64) else ex.flat.float()
            den = torch.dot(flat, flat).double()            # read with the step's statistics (sync/deferred.py)
            st.checks.append(([m.index for m in bucket.members], den, False))
            if probes:       # dense-classified tensors count fully in every gain's numerator and denominator
                st.den += den
                st.den_raw += den
                st.add_nums([den] * len(probes))
        self._start(b, ex, bucket.numel)

    def _launch_compressible(self, b: int) -> None:
        run, st, plan = self.running, self.running.stats, self.running.plan
        mem, codec, ctxs = self.memory.bucket(b), self.codecs[b], self.planner.ctxs[b]
        t0 = time.perf_counter()
        mem.release_gradients()
        for ctx in ctxs:
            ctx.step = plan.step
        self.update_space.begin(ctxs)
        norms: list[torch.Tensor] = []
        raw = [] if self.config.gravac.gain_denominator == "raw" else None
        xs = mem.stage(self.comp, ctxs, self.config.error_feedback, squares=norms, inv_scale=1.0 / run.loss_scale,
                       clip=self.local_clip, raw_squares=raw)
        for ctx, x in zip(ctxs, xs):
            ctx.residual = x
        squares = torch.stack(norms).double()
        den = squares.sum()                  # device values, read with the step's statistics (sync/deferred.py)
        st.checks.append(([m.index for m in codec.bucket.members], squares, True))
        st.den += den
        if raw is not None:
            st.den_raw += sum(raw)
        if self.sampled is not None:
            self.sampled.stage(b, mem.scratch)
        st.stage_s += time.perf_counter() - t0
        width = len(codec.bucket.members)
        live = [not self.planner.dense_at(b, (p,) * width) for p in plan.probes]
        st.add_nums([0.0 if ok else den for ok in live])      # levels that would go dense count ‖x‖² fully
        action, ex = plan.actions[b], None
        if action.kind is ActionKind.DEFERRED:
            lay, es = codec.encode(xs, None, plan.probes, live,
                                   extra_sends=self.planner.strict_candidates(plan, b))
            run.staged[b] = xs
        elif action.compressed:      # in chunks (cost model): chunk j+1 is encoded while chunk j is in flight
            ex = self.planner.chunked(b, action) if action.chunks > 1 else None
            lay, es = (codec.encode(xs, action.levels, plan.probes, live) if ex is None else
                ex.encode_and_issue(xs, plan.probes, live, self.channels.data_channels, self._issue_held))
            run.encode_s[b] = es.compress_s - es.probe_s
        else:
            lay, es = codec.encode(xs, None, plan.probes, live) if plan.probes else (None, None)
        if es is not None:
            st.add_nums(es.nums)
            st.compress_s += es.compress_s
            st.probe_s += es.probe_s
        if action.kind is not ActionKind.DEFERRED:
            self._send_compressible(b, action, xs, lay, ex)

    def _send_compressible(self, b: int, action: BucketAction, xs: list[torch.Tensor],
                           lay: Optional[SendLayout], ex: Optional[Exchange] = None) -> None:
        """Launch a staged compressible bucket: its payload (``ex``: in chunks, already issued), or x dense."""
        run, codec, mem = self.running, self.codecs[b], self.memory.bucket(b)
        if action.compressed:
            assert lay is not None
            if ex is None:
                codec.leave_memory(xs, lay)
                ex = self.planner.exchange(b, action, lay)
            run.layouts[b] = lay
            self.selection_check.record(codec, action.levels)
            self._start(b, ex, lay.values_sent)
        else:
            ex = DenseAllReduce(self.rule, self.world_size, f"bucket {b} (dense)", flat=mem.scratch)
            self._start(b, ex, codec.bucket.numel)

    def _start(self, b: int, ex: Exchange, values: int) -> None:
        run = self.running
        if self.config.bulk:
            run.held.append(ex)
        else:
            ex.launch(self.channels.data_channels)
        run.exchanges[b] = ex
        run.stats.bytes_sent += ex.bytes_sent
        run.stats.values_sent += values

    def _mark_nonfinite(self, members: list[Member]) -> None:
        for m in members:
            self.running.stats.mark_nonfinite(m.index)

    # ---- end of backward ----------------------------------------------------------------------------------
    def _finish(self) -> None:
        """End of the boundary backward: launch the rest, agree, then commit and write every ``p.grad``."""
        run = self.running
        t0 = self.backward_end_t = time.perf_counter()
        for m in self.members:
            if m.param.grad is None:
                m.param.grad = torch.zeros_like(m.param)
            elif m.param.grad.is_sparse:
                raise GravacError(f"ds_gravac: sparse gradients (e.g. nn.Embedding(sparse=True)) are not "
                                  f"supported (parameter '{m.name}')")
        run.pending = [0] * len(run.pending)
        self._launch_prefix()
        self.selection_check.check()
        if run.plan.decision.deferred:
            self.streams.join()           # CUDA: strict mode sends the side stream's staged inputs from here
            agreed = self._resolve_strict()
            self._issue_later_rounds(block=True)
        else:
            work, rows = self.stats.exchange(run.stats, async_op=True)
            self._issue_later_rounds(block=True)
            work.wait()
            agreed = self.stats.agree(rows, run.plan)
        self.streams.join()               # CUDA: decode and write-back on the main stream see the side stream's work
        timings = complete_step(self, agreed)
        if self.after_write is not None:
            self.after_write()
        if self.aggregate is not None:          # a step not sampled reports nothing, like a non-finite one
            self.aggregate.end_step(agreed.nonfinite == 0 and self.sampled is not None)
        timings["finish_s"] = time.perf_counter() - t0
        self.last_launch_times = dict(run.launch_t)
        if not self.plan.frozen:
            self._freeze_plan()
        self._publish(agreed, timings)
        if any([codec.end_step() for codec in self.codecs.values()]):
            release_freed_host_memory()
        self.running = None

    def _issue_later_rounds(self, block: bool) -> None:
        if self.planner.max_rounds < 2:
            return
        with self.streams.launch(self.device):
            self.running.issue_later_rounds(self.planner.max_rounds, len(self.plan.buckets),
                                            self.channels.data_channels, block)

    def _resolve_strict(self) -> AgreedStats:
        """Strict decision: blocking statistics exchange, resolve the branch, then send in plan order."""
        run = self.running
        rows = self.stats.exchange(run.stats, async_op=False)[1]
        agreed = self.stats.agree(rows, run.plan)
        if agreed.nonfinite > 0:
            return agreed            # nothing compressible was launched; the non-finite fallback sends raw g
        self.controller.observe(agreed)
        run.observed = True
        candidates = {b: self.planner.strict_candidates(run.plan, b) for b in run.staged}
        run.plan = self.planner.resolved(run.plan, self.controller.resolve(run.plan.decision, agreed))
        for b in sorted(run.staged):
            action = run.plan.actions[b]
            lay = self.codecs[b].layout(action.levels) if action.compressed else None
            if action.compressed and lay is not None and action.levels not in candidates[b]:
                lay, es = self.codecs[b].encode(run.staged[b], action.levels, (), ())
                run.stats.compress_s += es.compress_s
            self._send_compressible(b, action, run.staged[b], lay)
        self._issue_held()
        return agreed

    # ---- records ------------------------------------------------------------------------------------------
    def _publish(self, agreed: AgreedStats, timings: dict[str, float]) -> None:
        run = self.running
        if agreed.nonfinite == 0 and not run.observed:
            self.controller.observe(agreed)
        rec = step_record_of(self, run, agreed, timings)
        self.stats.step_done(run.plan.step, run.stats, timings, rec)

    @property
    def last_record(self) -> dict[str, Any]:
        return self.stats.last_record

    def pop_records(self) -> list[dict[str, Any]]:
        return self.stats.pop_records()

    # ---- state and lifecycle ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return sync_state_dict(self)

    def load_state_dict(self, state: dict[str, Any], memory: bool = True) -> None:
        load_sync_state(self, state, memory)

    def drain(self) -> None:
        """Nothing is in flight between steps (each step's statistics are waited for at its end)."""

    def reset_memory(self, names: Optional[set[str]] = None) -> None:
        self.memory.reset(names)
        if names is None:
            self.server.reset()

    def install(self) -> None:
        """Start hooking the engine's backward (attach's install stage; :meth:`close` undoes it)."""
        self.hooks.install()

    def close(self) -> None:
        self.hooks.remove()
        self.stats.close()
