"""The per-step statistics exchange, the bounded per-step records, and the step timing the controller needs.

Every step ends with one all-gather of a fixed-length float64 vector per rank on the control channel (waited
for before any gradient is written, because it also carries the non-finite agreement). It carries the previous
step's iteration time and gain-computation time, so the controller pairs the two from the same step, and the
previous step's phase timings, whose cross-rank maxima complete that step's record.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Any, Callable, Optional

import torch

from ..telemetry import stats as statvec
from ..telemetry.stats import AgreedStats, StepStats
from .aggregate_gain import AggregateGain
from .quant_variance import QuantVariance
from .sparse_unsent import SparseUnsent
from .collectives import Work, all_gather_async
from .deferred import resolve
from .step_plan import StepPlan

RECORDS_KEPT = 256           # per-step records kept for pop_stats(); older ones are dropped (bounded memory)


class StepStatistics:
    """One engine's statistics exchange, records and timing (see the module docstring)."""

    def __init__(self, engine: Any, world_size: int, control: Any,
                 on_record: Optional[Callable[[dict[str, Any]], None]] = None,
                 aggregate: Optional[AggregateGain | QuantVariance | SparseUnsent] = None) -> None:
        self.engine, self.world_size, self.control, self.on_record = engine, world_size, control, on_record
        self.aggregate = aggregate       # its tail (the previous step's aggregate gain) rides on every vector
        self.length = statvec.LENGTH + (aggregate.width if aggregate is not None else 0)
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=RECORDS_KEPT)
        self.last_record: dict[str, Any] = {}
        self.agreed_lr = math.nan        # rank 0's learning rate of the last finite step (NaN before any)
        self.reset_timing()
        self._opt_hook = _register_step_hook(engine, self._on_optimizer_step)

    # ---- the exchange -------------------------------------------------------------------------------------
    def exchange(self, stats: StepStats, async_op: bool) -> tuple[Work, torch.Tensor]:
        resolve(stats)                   # the device sums and non-finite checks of the step, read once
        vals = {"den": stats.den, "den_raw": stats.den_raw, "values_sent": stats.values_sent,
                "bytes_sent": stats.bytes_sent, "nonfinite": stats.nonfinite,
                "nonfinite_first": stats.nonfinite_first, "lr": _current_lr(self.engine),
                "t_iter_prev": self.t_iter_last, "t_gain_prev": self._t_gain_last, **self._timings_prev}
        vec = statvec.pack(vals, stats.nums)
        if self.aggregate is not None:
            vec = torch.cat([vec, self.aggregate.tail()])
        rows = torch.zeros(self.world_size * self.length, dtype=torch.float64)
        work = all_gather_async(rows, vec, self.control, "all_gather of the step statistics")
        if not async_op:
            work.wait()
        return work, rows

    def agree(self, rows: torch.Tensor, plan: StepPlan) -> AgreedStats:
        """Rank-order sums (identical on every rank) of the gathered vectors."""
        table = rows.view(self.world_size, self.length)
        red = statvec.reduce_rows(table[:, :statvec.LENGTH], len(plan.probes))
        s, n = red.sums, self.world_size
        if self.records and self.records[-1]["step"] == self._prev_step:
            self.records[-1].update({f"{k}_max": v for k, v in red.maxima.items()})
        lr = red.per_rank["lr"][0]
        agreed = AgreedStats(step=plan.step, decision=plan.decision, den=s["den"], den_raw=s["den_raw"],
                             nums=red.nums, t_iter_prev=s["t_iter_prev"] / n, t_gain_prev=s["t_gain_prev"] / n,
                             values_sent=s["values_sent"], bytes_sent=s["bytes_sent"], nonfinite=s["nonfinite"],
                             world_size=n, lr=lr, nonfinite_first=tuple(red.per_rank["nonfinite_first"]),
                             aggregate=None if self.aggregate is None
                             else self.aggregate.agreed(table[:, statvec.LENGTH:].tolist()))
        if agreed.nonfinite == 0 and math.isfinite(lr):
            self.agreed_lr = lr
        return agreed

    # ---- records ------------------------------------------------------------------------------------------
    def step_done(self, step: int, stats: StepStats, timings: dict[str, float], record: dict[str, Any]) -> None:
        """Remember what the next step's vector carries and keep the record."""
        self._t_gain_last = stats.probe_s
        self._timings_prev = {"stage_s": stats.stage_s, "compress_s": stats.compress_s, **timings}
        self._prev_step = step
        self.last_record = record
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def pop_records(self) -> list[dict[str, Any]]:
        recs = list(self.records)
        self.records.clear()
        return recs

    # ---- timing -------------------------------------------------------------------------------------------
    def _on_optimizer_step(self, *_: Any) -> None:
        now = time.perf_counter()
        if self._opt_end_t is not None:
            self.t_iter_last = now - self._opt_end_t
        self._opt_end_t = now

    def reset_timing(self) -> None:
        """Forget every measurement of earlier steps (attach, and a checkpoint load in the middle of a run)."""
        self._opt_end_t: Optional[float] = None
        self.t_iter_last = 0.0
        self._t_gain_last = 0.0
        self._timings_prev: dict[str, float] = {}
        self._prev_step = -1

    def close(self) -> None:
        if self._opt_hook is not None:
            self._opt_hook.remove()


def _register_step_hook(engine: Any, fn: Any) -> Any:
    """``t_iter``: the time between the ends of consecutive optimizer steps."""
    opt = getattr(engine, "basic_optimizer", None)
    if isinstance(opt, torch.optim.Optimizer):
        return opt.register_step_post_hook(fn)
    return None


def _current_lr(engine: Any) -> float:
    try:
        return float(engine.get_lr()[0])
    except Exception:   # no optimizer (inference-only engines): LR never drives a decision then
        return math.nan
