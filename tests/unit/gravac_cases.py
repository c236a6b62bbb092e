"""Shared cases of the GraVAC controller tests: configs and contexts, scripted gain and time streams (the
paper's 1280x/2000x table among them) and a simulator that feeds them through the synchronizer's protocol."""
from __future__ import annotations

import math
from typing import Callable, Optional

from ds_gravac.adapt.base import MAX_PROBES, AgreedStats, ControllerContext, StepDecision
from ds_gravac.adapt.gravac import GravacController
from ds_gravac.config import parse_config

N, B = 4, 32          # world size, samples per worker per step → T_sys = 128 / t_iter


def make_config(**overrides):
    cfg = dict(mode="gravac", theta_min=10, theta_max=1000, epsilon=0.7, omega=0.01, window=20,
               refresh_steps=5, min_sent_steps=2, ewma_alpha=0.5)
    cfg.update(overrides)
    return parse_config(cfg)


def make_ctx(grid=None, gain_kind="projection", level_kind="cf", world_size=N):
    def realize(theta: float) -> float:
        if grid is None:
            return float(theta)
        return float(next((g for g in grid if g >= theta), grid[-1]))
    return ControllerContext(world_size=world_size, samples_per_step=B, realize_cf=realize, cf_grid=grid,
                             multilevel="exact", gain_kind=gain_kind, level_kind=level_kind,
                             compressible=("a", "b"))


def make_ctrl(ctx=None, **overrides) -> GravacController:
    ctrl = GravacController(make_config(**overrides))
    ctrl.bind(ctx or make_ctx())
    return ctrl


def log_gain(theta: float, i: int = 0) -> float:
    """Stationary gains, > 1% apart between consecutive candidates (no escalation), all ≥ ε = 0.7."""
    return 0.95 - 0.02 * math.log2(theta / 10.0)


def log_tsys(theta: float, i: int = 0) -> float:
    """Throughput rising steeply with the CF, so T_c never saturates."""
    return 50.0 if theta <= 1 else 100.0 * (1.0 + math.log2(theta))


class Sim:
    """Drives a controller exactly like the synchronizer (pipelined or strict, docs/algorithms.md)."""

    def __init__(self, ctrl, gain: Callable[[float, int], float], tsys: Callable[[float, int], float],
                 den: Callable[[int], float] = lambda i: 1.0, t_gain: Callable[[int], float] = lambda i: 0.0,
                 force: Callable[[int], bool] = lambda i: i == 0) -> None:
        self.ctrl, self.gain, self.tsys, self.den, self.t_gain, self.force = ctrl, gain, tsys, den, t_gain, force
        self.pending: Optional[AgreedStats] = None
        self.sent: dict[int, float] = {}
        self.decisions: list[StepDecision] = []
        self.trace: list[tuple[float, float, str]] = []      # (θ_min, θ_c, phase) after each decision
        self.step = 0

    def t_iter(self, i: int) -> float:
        cf = self.sent.get(i)
        if cf is None:
            return 0.0
        return N * B / self.tsys(cf, i) + (self.t_gain(i) if cf == 1.0 else 0.0)

    def stats(self, i: int, d: StepDecision) -> AgreedStats:
        den = self.den(i)
        nums = tuple(self.gain(level, i) * den for level in d.probe_levels)
        return AgreedStats(step=i, decision=d, den=den, den_raw=den, nums=nums, t_iter_prev=self.t_iter(i - 1),
                           t_gain_prev=self.t_gain(i - 1), values_sent=0.0, bytes_sent=0.0, nonfinite=0.0,
                           world_size=N)

    def one(self) -> StepDecision:
        i, c = self.step, self.ctrl
        if c.strict:
            d = c.decide(i, 0.1, self.force(i))
            assert d.deferred
            st = self.stats(i, d)
            c.observe(st)
            final = c.resolve(d, st)
            assert not final.deferred
        else:
            if self.pending is not None:
                c.observe(self.pending)
            final = c.decide(i, 0.1, self.force(i))
            self.pending = self.stats(i, final)
        assert final.step == i and len(final.probe_levels) <= MAX_PROBES
        assert final.send_level == (1.0 if final.branch == "dense" else final.send_level)
        self.sent[i] = 1.0 if final.branch == "dense" else final.send_level
        self.decisions.append(final)
        self.trace.append((c.theta_min, c.theta_c, c.phase))
        self.step += 1
        return final

    def run(self, n: int) -> "Sim":
        for _ in range(n):
            self.one()
        return self

    def sent_levels(self, start: int, stop: int) -> set[float]:
        return {self.sent[i] for i in range(start, stop)}


def window_range(k: int, window: int = 20, i0: int = 1) -> range:
    """Steps of the k-th window (k ≥ 1): [i0 + (k−1)·window, i0 + k·window)."""
    return range(i0 + (k - 1) * window, i0 + k * window)


def settle_tc(tc: dict[float, float]) -> Callable[[float, int], float]:
    """T_sys making T_c(θ) = T̄_sys·δ(θ) equal the scripted values."""
    return lambda t, i: 50.0 if t <= 1 else tc[t] / log_gain(t)


PAPER_TC = {10.0: 250.0, 20.0: 300.0, 40.0: 400.0, 80.0: 500.0, 160.0: 600.0, 320.0: 700.0, 640.0: 800.0,
            1280.0: 1029.9, 2000.0: 1035.4}


def drifting_tc(step_change: int) -> Callable[[float, int], float]:
    """Paper table; from ``step_change`` on, 1280x gets 20% slower (T_c 1029.9 → ~824)."""
    base = settle_tc(PAPER_TC)
    return lambda t, i: base(t, i) * (0.8 if t == 1280.0 and i >= step_change else 1.0)


def wavy_gain(theta: float, i: int) -> float:
    base = {10.0: 0.8, 20.0: 0.72, 40.0: 0.66, 160.0: 0.62, 1000.0: 0.6}[theta]
    return base + 0.15 * math.sin(0.7 * i + math.log(theta))
