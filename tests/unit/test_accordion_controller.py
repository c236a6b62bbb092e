"""Accordion controller (docs/algorithms.md): interval-only switching, ρ ≥ η → low, LR-decay rule, round trip."""
from __future__ import annotations

import json
from typing import Callable

import pytest
import torch

from ds_gravac.adapt import build_controller
from ds_gravac.adapt.accordion import AccordionController
from ds_gravac.adapt.base import ControllerContext, StepDecision
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError

NAMES = ("a", "b", "c")
LOW_CF, HIGH_CF = 1.01, 10.0


def make_config(interval=4, accum=None, **acc):
    section = {"interval_steps": interval, **acc}
    if accum is not None:
        section["accum_steps"] = accum
    return parse_config({"mode": "accordion", "accordion": section})


def make_ctx(level_kind="cf", rank=0, names=NAMES):
    return ControllerContext(world_size=2, samples_per_step=8, realize_cf=float, cf_grid=None, multilevel="exact",
                             gain_kind="projection", level_kind=level_kind, compressible=names, rank=rank)


def make_ctrl(interval=4, accum=None, ctx=None, **acc) -> AccordionController:
    ctrl = AccordionController(make_config(interval, accum, **acc))
    ctrl.bind(ctx or make_ctx())
    return ctrl


GradFn = Callable[[str, int], float]


class Sim:
    """The synchronizer's Accordion protocol: broadcast point → propose/accept → decide → collect (rank 0)."""

    def __init__(self, ctrl: AccordionController, grad: GradFn, lr: Callable[[int], float] = lambda i: 0.1):
        self.ctrl, self.grad, self.lr = ctrl, grad, lr
        self.decisions: list[StepDecision] = []
        self.collected: list[int] = []
        self.step = 0

    def run(self, n: int) -> "Sim":
        for _ in range(n):
            i, c = self.step, self.ctrl
            if c.broadcast_point(i):
                proposal = c.propose(i, self.lr(i))
                assert proposal.dtype == torch.int64 and proposal.shape == (c.proposal_size(),)
                c.accept(i, proposal.clone())
            self.decisions.append(c.decide(i, self.lr(i), False))
            if c.collects_gradients(i):
                self.collected.append(i)
                for name in NAMES:
                    c.collect(name, torch.full((5,), self.grad(name, i), dtype=torch.float32))
            self.step += 1
        return self

    def levels(self, i: int) -> tuple[float, ...]:
        return tuple(self.decisions[i].level_for(n) for n in NAMES)


def scripted(i: int, name: str) -> float:
    """a: constant; b: ×3 from step 4 on, back ×(1/3.5) from 12; c: zero during [0, 4), then 1."""
    if name == "a":
        return 1.0
    if name == "b":
        return 1.0 if i < 4 else (3.0 if i < 12 else 3.0 / 3.5)
    return 0.0 if i < 4 else 1.0


def test_switches_only_at_interval_boundaries():
    sim = Sim(make_ctrl(), lambda n, i: scripted(i, n)).run(16)
    L, H = LOW_CF, HIGH_CF
    # s_0 = 0 and s_1 = 4 (W_1 = W_0 since A = I): every layer low
    assert all(sim.levels(i) == (L, L, L) for i in range(8))
    # s_2 = 8: n(1) over steps 0..3, n(2) over 4..7 — a: ρ = 0 → high; b: ρ = |1 − 3|/1 = 2 → low;
    # c: n(1) = 0 → critical → low
    assert all(sim.levels(i) == (H, L, L) for i in range(8, 12))
    # s_3 = 12: n(2) vs n(3) over 8..11 — all unchanged → high
    assert all(sim.levels(i) == (H, H, H) for i in range(12, 16))
    assert sim.collected == list(range(16))                             # A = I: every step accumulates
    assert all(d.branch == "cand" and d.send_level == HIGH_CF for d in sim.decisions)


def test_rho_threshold_is_inclusive():
    # b changes by exactly η = 0.5 between windows → critical (ρ ≥ η); a by 0.4 → high
    grad = lambda n, i: 1.0 if i < 4 else {"a": 1.4, "b": 1.5, "c": 1.0}[n]
    sim = Sim(make_ctrl(), grad).run(9)
    assert sim.levels(8) == (HIGH_CF, LOW_CF, HIGH_CF)


def test_short_accumulation_windows():
    # I = 6, A = 2: W_0 = [0, 2), W_1 = [4, 6), W_2 = [10, 12); the first comparison is at s_1 = 6
    grad = lambda n, i: {"a": 1.0, "b": 1.0 if i < 2 else 2.0, "c": 5.0}[n]
    sim = Sim(make_ctrl(interval=6, accum=2), grad).run(13)
    assert sim.collected == [0, 1, 4, 5, 10, 11]
    assert sim.levels(5) == (LOW_CF,) * 3
    assert sim.levels(6) == (HIGH_CF, LOW_CF, HIGH_CF)                  # b: n 2 → 4, ρ = 1
    assert sim.levels(12) == (HIGH_CF, HIGH_CF, HIGH_CF)               # b: W_1 and W_2 both 2.0


def test_overlapping_first_windows():
    # I = 4, A = 3: W_0 = [0, 3) and W_1 = [1, 4) overlap; a grows so that n(1)/n(0) = (1+2+3)/(0+1+2) = 2
    grad = lambda n, i: float(i) if n == "a" else 1.0
    sim = Sim(make_ctrl(interval=4, accum=3), grad).run(5)
    assert sim.levels(4) == (LOW_CF, HIGH_CF, HIGH_CF)


def test_lr_decay_forces_low_until_next_decision_point():
    lr = lambda i: 0.1 if i < 9 else 0.01
    sim = Sim(make_ctrl(), lambda n, i: 1.0, lr=lr).run(17)
    assert sim.levels(8) == (HIGH_CF,) * 3
    assert all(sim.levels(i) == (LOW_CF,) * 3 for i in (9, 10, 11))    # decay at 9 → low until s_3 = 12
    assert all(sim.levels(i) == (HIGH_CF,) * 3 for i in range(12, 17))
    assert sim.ctrl.telemetry()["accordion/low_fraction"] == 0.0
    events = [e for e in sim.ctrl.pop_events() if e["event"] == "accordion_lr_decay"]
    assert [(e["step"], e["low_until"]) for e in events] == [(9, 12)]


def test_lr_decay_at_decision_point_covers_that_interval():
    lr = lambda i: 0.1 if i < 8 else 0.01
    sim = Sim(make_ctrl(), lambda n, i: 1.0, lr=lr).run(13)
    assert all(sim.levels(i) == (LOW_CF,) * 3 for i in range(8, 12))
    assert sim.levels(12) == (HIGH_CF,) * 3


def test_lr_decay_rule_off_and_lr_increase_ignored():
    sim = Sim(make_ctrl(lr_decay_rule=False), lambda n, i: 1.0, lr=lambda i: 0.1 / (1 + i)).run(10)
    assert sim.levels(9) == (HIGH_CF,) * 3
    warm = Sim(make_ctrl(), lambda n, i: 1.0, lr=lambda i: 0.01 * (1 + i)).run(10)
    assert warm.levels(9) == (HIGH_CF,) * 3


def test_force_dense_and_telemetry():
    ctrl = make_ctrl()
    ctrl.accept(0, ctrl.propose(0, 0.1))
    d = ctrl.decide(0, 0.1, True)
    assert d.branch == "dense" and d.forced_dense and d.level_for("a") == 1.0
    d = ctrl.decide(1, 0.1)
    assert d.layer_levels == {"a": LOW_CF, "b": LOW_CF, "c": LOW_CF}
    assert ctrl.telemetry()["accordion/low_fraction"] == 1.0


def test_levels_defaults_and_overrides():
    assert (make_ctrl().low, make_ctrl().high) == (1.01, 10.0)
    rank = make_ctrl(ctx=make_ctx(level_kind="rank"))
    assert (rank.low, rank.high) == (4.0, 1.0)
    custom = make_ctrl(low_compression=1.5, high_compression=1000)
    assert (custom.low, custom.high) == (1.5, 1000.0)
    with pytest.raises(GravacConfigError, match="integer ranks"):
        make_ctrl(ctx=make_ctx(level_kind="rank"), low_compression=2.5, high_compression=2.5)


def test_only_rank0_accumulates():
    ctrl = make_ctrl(ctx=make_ctx(rank=1))
    assert not any(ctrl.collects_gradients(i) for i in range(8))
    assert make_ctrl().collects_gradients(0)
    assert isinstance(build_controller(make_config()), AccordionController)


@pytest.mark.parametrize("cut", [4, 8, 12, 16])
def test_state_dict_json_round_trip_at_window_ends(cut):
    grad = lambda n, i: scripted(i, n)
    lr = lambda i: 0.1 if i < 13 else 0.05
    ref = Sim(make_ctrl(), grad, lr).run(20)
    sim = Sim(make_ctrl(), grad, lr).run(cut)
    state = json.loads(json.dumps(sim.ctrl.state_dict()))
    fresh = make_ctrl()
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    sim.ctrl = fresh
    sim.run(20 - cut)
    assert sim.decisions == ref.decisions
    assert sim.ctrl.state_dict() == ref.ctrl.state_dict()


def test_resume_inside_accumulation_window_is_critical():
    grad = lambda n, i: 1.0
    sim = Sim(make_ctrl(), grad).run(10)                               # inside W_3 = [8, 12)
    fresh = make_ctrl()
    fresh.load_state_dict(json.loads(json.dumps(sim.ctrl.state_dict())))
    sim.ctrl = fresh
    sim.run(7)
    assert sim.levels(11) == (HIGH_CF,) * 3                            # levels of s_2 kept until s_3
    assert sim.levels(12) == (LOW_CF,) * 3                             # W_3 incomplete → critical
    assert sim.levels(16) == (LOW_CF,) * 3                             # no reference n(3) at s_4 either
