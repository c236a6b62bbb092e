"""What a synchronizer publishes and saves, kept apart from the scheduler: the user-facing record of one step and
the per-rank state a checkpoint carries."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..telemetry import stats as statvec
from ..telemetry.stats import AgreedStats
from .collectives import ring_allreduce_bytes
from .parts import SyncParts
from .step_plan import DENSE

if TYPE_CHECKING:
    from .running_step import RunningStep


def step_record_of(sync: SyncParts, run: "RunningStep", agreed: AgreedStats,
                   timings: dict[str, float]) -> dict[str, Any]:
    """The record of the finished step ``run``: bytes and values as sent (a non-finite step counts as dense),
    phase timings, the controller's telemetry and, with probes, the raw gain of every measured level."""
    st, nonfinite = run.stats, agreed.nonfinite > 0
    actions = run.plan.actions if not nonfinite else tuple(DENSE for _ in run.plan.actions)
    compressed = [b for b, a in enumerate(actions) if a.compressed]
    compressed_numel = sum(sync.plan.buckets[b].numel for b in compressed)
    dense_values = sync.numel_total - compressed_numel
    payload = (sum(4 * run.layouts[b].payload_words for b in compressed)
        + dense_values * sync.rule.comm_bytes_per_element)
    decision = run.plan.decision
    rec = statvec.step_record(
        step=run.plan.step, mode=sync.config.mode, branch="dense" if nonfinite else str(decision.branch),
        cf_sent=1.0 if nonfinite else decision.send_level, level_kind=str(sync.comp.level_kind),
        numel_total=sync.numel_total, values_sent=st.values_sent, bytes_sent=st.bytes_sent,
        dense_bytes=ring_allreduce_bytes(sync.rule.engine_bytes_per_element * sync.numel_total, sync.world_size),
        payload_bytes=payload,
        compressed_numel=compressed_numel, compressed_values=st.values_sent - dense_values,
        nonfinite=int(agreed.nonfinite), t_iter_prev=sync.stats.t_iter_last, probe_s=st.probe_s,
        stage_s=st.stage_s, compress_s=st.compress_s, **timings, **sync.controller.telemetry(),
        **sync.planner.selector.after_step(run, sync.planner, nonfinite))
    if run.plan.probes and agreed.den > 0 and not nonfinite:
        rec.update({f"gain_raw@{p:g}": num / agreed.den for p, num in zip(run.plan.probes, agreed.nums)})
    return rec


def sync_state_dict(sync: SyncParts) -> dict[str, Any]:
    """Per-rank synchronizer state: the frozen bucket order, the error-feedback memory, the server residuals of
    the partitions this rank owns (quantizers) and the aggregate-gain sample still to be sent."""
    return {"bucket_order": list(sync.plan.order) if sync.plan.frozen else None,
            "layout_signature": sync.plan.layout_signature(), "memory": sync.memory.state_dict(),
            "server_residuals": sync.server.state_dict(),
            "aggregate_gain": sync.aggregate.state_dict() if sync.aggregate is not None else None}


def load_sync_state(sync: SyncParts, state: dict[str, Any], memory: bool) -> None:
    """Restore :func:`sync_state_dict`'s state; ``memory`` false (another world size, another compressor):
    only the bucket order, every per-rank memory starts empty."""
    order = state.get("bucket_order")
    if order is not None and (not sync.plan.frozen or list(sync.plan.order) != list(order)):
        sync.rebuild(order)
    usable = memory and state.get("memory") is not None
    if usable:
        sync.memory.load_state_dict(state["memory"])
        sync.server.load_state_dict(state.get("server_residuals"))
    else:
        sync.memory.reset()
        sync.server.reset()
    if sync.aggregate is not None:
        sync.aggregate.load_state_dict(state.get("aggregate_gain") if usable else None)
    sync.stats.reset_timing()
