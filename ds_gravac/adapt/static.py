"""Fixed-level baselines: ``static`` (one CF, EF on) and ``dense`` (bit-identical to DeepSpeed)."""
from __future__ import annotations

from typing import Any

from ..config import GravacConfig
from ..decision import StepDecision
from .base import AgreedStats, Controller, ControllerContext


class DenseController(Controller):
    """Every bucket dense, every step."""

    mode = "dense"

    def decide(self, step: int, lr: float, force_dense: bool = False) -> StepDecision:
        return StepDecision(step=step, branch="dense", send_level=1.0, forced_dense=force_dense)


class StaticController(Controller):
    """One level for the whole run after ``warmup_steps`` dense steps (a CF, or a low-rank compressor's
    ``rank``). The sent level's gain is measured every ``gain_interval``-th step only: nothing decides on it, and
    measuring it costs a decode of the payload."""

    mode = "static"

    def __init__(self, config: GravacConfig) -> None:
        super().__init__(config)
        self.level = config.static_cf()
        self.last_gain = float("nan")

    def bind(self, ctx: ControllerContext) -> None:
        super().bind(ctx)
        if ctx.default_level is not None:
            self.level = float(ctx.default_level)      # low-rank: the rank; quantizers without "cf": their own CF
        realized = ctx.realize_cf(self.level)
        if realized != self.level:
            self.log_event(0, "cf_snapped", requested=self.level, realized=realized)
        self.level = realized

    def decide(self, step: int, lr: float, force_dense: bool = False) -> StepDecision:
        if force_dense or step <= self.config.warmup_steps:
            return StepDecision(step=step, branch="dense", send_level=1.0, forced_dense=force_dense)
        every = self.config.gain_interval
        probes = (self.level,) if self.config.log_interval and every and step % every == 0 else ()
        return StepDecision(step=step, branch="cand", send_level=self.level, probe_levels=probes)

    def observe(self, stats: AgreedStats) -> None:
        if stats.decision.probe_levels and stats.den > 0:
            self.last_gain = stats.nums[0] / stats.den

    def telemetry(self) -> dict[str, Any]:
        return {"gravac/gain_cand_raw": self.last_gain, "gravac/theta_c": self.level}
