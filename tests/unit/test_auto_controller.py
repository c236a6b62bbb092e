"""``mode: "auto"`` in one process: the controller's plan against an injected link — the same signals compress
more on a slow link than on a fast one (the "link change re-plans" test at unit level), caps, lr drops, the
re-timed link and the norm-change phase."""
from __future__ import annotations

import math

import pytest

from ds_gravac.adapt.auto.controller import PLAIN
from ds_gravac.adapt.auto.ladder import LOWRANK, RANKS
from ds_gravac.adapt.auto.signals import GroupErrors
from ds_gravac.adapt.auto.timing import Pricer, link_fits
from ds_gravac.adapt.base import ControllerContext
from ds_gravac.sync.aggregate_gain import GroupSignal
from ds_gravac.sync.cost_model.fits import FitTable
from auto_cases import _controller, _exchange_s, _observe, _plan, _scaled, _signals


# ---- the plan against an injected link ---------------------------------------------------------------------------
def test_a_slow_link_compresses_more_than_a_fast_one() -> None:
    slow, slow_codes, slow_bytes = _plan(1e8)       # 100 Mbit/s
    fast, fast_codes, fast_bytes = _plan(1e11)      # 100 Gbit/s
    assert not slow.tight and not fast.tight
    assert slow_bytes < fast_bytes
    assert any(c > 0 for c in slow_codes)           # something is compressed on the slow link
    for ctl in (slow, fast):                        # within the quiet budget: rank 16's error everywhere
        assert ctl.last["error"] <= ctl.last["budget"] == ctl.last["ref_error"]
        assert ctl.last["time"] <= ctl.last["ref_time"]                   # the reference is always a candidate
    # the codes reach the tensors: a rank rung as the rank, the dense rung as a rank no matrix pays for (plain)
    decision = slow.decide(slow.tight_until, 0.1)
    for g, c in zip(slow.groups, slow_codes):
        level = g.ladder[c]
        want = float(level.value) if level.family == LOWRANK else PLAIN
        assert all(decision.level_for(m) == want for m in g.members)
    assert all(math.isfinite(v) for v in slow.last.values())
    # the decision's per-group record: errors that sum to the plan's and the reference's, within the caps, and
    # the energies the signals carried (10 per member: ``_signals``)
    plan = [e for e in slow.pop_events() if e["event"] == "auto_plan"][-1]
    assert sum(plan["error"]) == pytest.approx(slow.last["error"], rel=1e-12)
    assert sum(plan["reference_error"]) == pytest.approx(slow.last["ref_error"], rel=1e-12)
    assert plan["budget"] == slow.last["budget"] and all(e <= c for e, c in zip(plan["error"], plan["caps"]))
    assert plan["energy"] == [10.0 * g.count for g in slow.groups]


@pytest.mark.parametrize("rate_bit_s", [1e7, 1e8])
def test_no_group_exceeds_its_cap_and_without_caps_one_would(rate_bit_s: float) -> None:
    """On a slow link the summed budget alone lets the steep group go to rank 2 (6.7 times its own rank-16
    error) and pays for it with a dense group; with ``group_cap`` 2 (the default) every group stays within
    2·β·its reference error."""
    errors_of = {}
    for cap in (None, 2.0):
        ctl = _controller(rate_bit_s, steep="512x4608", group_cap=cap)
        quiet = ctl.tight_until
        ctl.accept(quiet, ctl.propose(quiet, 0.1))
        _, errors = ctl._tables(ctl.signals)
        ratios = [errors[g][c] / errors[g][r] for g, (c, r) in enumerate(zip(ctl.codes, ctl.reference))]
        errors_of[cap] = max(ratios)
        assert ctl.last["error"] <= ctl.last["budget"]
    assert errors_of[None] > 2.0 >= errors_of[2.0]


def test_a_link_change_re_plans_at_the_next_decision() -> None:
    """Fast at attach, 1000x slower when re-timed: the first quiet plan is the fast link's, the next decision
    (which re-times the link first) is the slow link's plan."""
    ctl = _controller(1e11, remeasured_bit_s=1e8)
    fast_codes = _plan(1e11)[1]
    slow_codes = _plan(1e8)[1]
    assert fast_codes != slow_codes
    step = ctl.tight_until
    for expected in (fast_codes, slow_codes):
        ctl.before_proposal(step)
        ctl.accept(step, ctl.propose(step, 0.1))
        assert ctl.codes == expected
        step += ctl.interval
    assert [e["event"] for e in ctl.pop_events() if e["event"] == "auto_link_measured"] == ["auto_link_measured"]


def test_a_step_drop_of_the_learning_rate_tightens_a_smooth_decay_does_not() -> None:
    ctl = _controller(1e8)
    quiet = ctl.tight_until
    for step, lr in enumerate([0.1, 0.099, 0.0985, 0.098], start=quiet):     # cosine-like: < 20% per step
        ctl.decide(step, lr)
    assert ctl.tight_until == quiet and not bool(ctl.propose(quiet + 4, 0.098)[-1])
    assert bool(ctl.propose(quiet + 4, 0.0098)[-1])         # rank 0 sees the drop at the decision itself ...
    ctl.decide(quiet + 4, 0.0098)
    assert ctl.tight_until == quiet + 4 + ctl.interval      # ... and every rank keeps it tight for I steps
    assert bool(ctl.propose(quiet + 4 + ctl.interval - 1, 0.0098)[-1])
    assert not bool(ctl.propose(quiet + 4 + ctl.interval, 0.0098)[-1])


def test_group_errors_average_the_interval_and_keep_unmeasured_ranks() -> None:
    """Worked by hand: fractions are Σ unsent / Σ energy over the steps that measured the rank; a rank not measured
    in an interval keeps its fraction, applied to the new energy; a rank never measured counts as all unsent."""
    from ds_gravac.adapt.auto.ladder import build_groups

    groups = build_groups([("w", (256, 128))], families=(LOWRANK,), classifier=None, min_numel=0)
    assert [int(lv.value) for lv in groups[0].ladder[1:]] == [32, 16, 8, 4, 2]
    errs = GroupErrors(groups, RANKS)

    def signal(den: float, captured: dict) -> tuple:
        return (GroupSignal(den=den, applied=den, prefix=tuple(captured.get(r) for r in RANKS)),)

    errs.add(signal(10.0, {16: 8.0, 8: 6.0, 4: 4.0, 2: 2.0}))      # sent at rank 16: ranks <= 16 measured
    errs.add(signal(20.0, {16: 18.0, 8: 14.0}))                    # only 16 and 8 measured
    assert not errs.ready
    errs.close_interval()
    assert errs.ready and errs.energy == [15.0]
    # the residual in flight E·u/(1 − u) of the unsent fractions u: rank 32 never measured (u clamped to 1 − 10⁻⁶),
    # rank 16 4/30, rank 8 10/30, rank 4 6/10, rank 2 8/10
    never = (1.0 - 1e-6) / 1e-6
    assert errs.errors(groups)[0] == pytest.approx([0.0, 15.0 * never, 15.0 * 4 / 26, 15.0 * 10 / 20, 15.0 * 6 / 4,
                                                    15.0 * 8 / 2], rel=1e-9)
    errs.add(signal(30.0, {}))                                      # sent plain: nothing but the energy
    errs.close_interval()
    assert errs.errors(groups)[0] == pytest.approx([0.0, 30.0 * never, 30.0 * 4 / 26, 30.0 * 10 / 20, 30.0 * 6 / 4,
                                                    30.0 * 8 / 2], rel=1e-9)
    assert errs.norm_changes() == pytest.approx([math.sqrt(2.0) - 1.0], rel=1e-15)     # √30 against √15


# ---- refit and the norm-change phase ----------------------------------------------------------------------------
def test_a_step_off_its_prediction_re_times_the_link() -> None:
    """Each decision predicts the next interval's step as measured − exchange(plan run) + exchange(new plan);
    within ``refit_tolerance`` (3%) nothing is re-timed, nor at one interval 10% off (one interval's median is
    noise), nor at 10% under then 10% over; 10% over at two decisions in a row re-times the link before the next
    plan (here a 1000x slower one, which that plan then prices)."""
    ctl = _controller(1e11, remeasured_bit_s=1e8, remeasure_decisions=0)
    step, signals = ctl.tight_until, _signals(ctl)
    for s in range(3, step):
        _observe(ctl, s, signals, t_iter=1.0)
    ran = list(ctl.codes)
    ctl.before_proposal(step)
    ctl.accept(step, ctl.propose(step, 0.1))
    expected = 1.0 - _exchange_s(1e11, ctl.groups, ran) + _exchange_s(1e11, ctl.groups, ctl.codes)
    assert ctl.last["step"] == pytest.approx(expected, rel=1e-12) and ctl.last["measured_step"] == 1.0
    assert ctl.telemetry()["auto/predicted_step_s"] == ctl.last["step"]
    fast_codes = list(ctl.codes)
    for factor, re_timed in ((1.0, False), (1.02, False), (0.90, False), (1.10, False), (1.10, True)):
        measured = factor * ctl.last["step"]
        for s in range(step, step + ctl.interval):
            _observe(ctl, s, signals, t_iter=measured * (1.0 + 0.5 * (s % 2 - 0.5) * 1e-3))    # median: measured
        step += ctl.interval
        ctl.before_proposal(step)
        events = [e for e in ctl.pop_events() if e["event"] == "auto_link_measured"]
        assert bool(events) == re_timed, factor
        ctl.accept(step, ctl.propose(step, 0.1))
    assert events[0]["reason"] == "step_off" and events[0]["measured_over_predicted"] == pytest.approx(1.10)
    assert ctl.codes == _plan(1e8)[1] != fast_codes             # the next plan prices the re-timed link


def test_shared_buckets_price_an_all_dense_interval_as_a_dense_step() -> None:
    """With ``auto.buckets: "shared"`` a dense group rides plain fp32 in a shared bucket, but a step whose groups
    are all dense is one dense all-reduce in the dense dtype: the compute term fitted after an all-dense interval
    takes that price off the measured step, not the fp32 sum of the dense rungs."""
    ctl = _controller(1e9, buckets="shared", dense_bytes=2)
    step, signals = ctl.tight_until, _signals(ctl)
    for s in range(3, step):
        _observe(ctl, s, signals, t_iter=1.0)
    assert all(g.ladder[c].family == "dense" for g, c in zip(ctl.groups, ctl.codes))
    ctl.accept(step, ctl.propose(step, 0.1))
    pricer = Pricer(FitTable(link_fits(1e9, 1e-4, 2)), 2, dense_bytes=ctl.ctx.dense_bytes_per_element, shared=True)
    dense_step = pricer.dense_step(ctl.groups)
    fp32_sum = sum(row[0] for row in pricer.times(ctl.groups))
    assert dense_step < 0.9 * fp32_sum
    assert ctl.last["compute"] == pytest.approx(1.0 - dense_step, rel=1e-12)
    new = dense_step if all(c == 0 for c in ctl.codes) else sum(
        row[c] for row, c in zip(pricer.times(ctl.groups), ctl.codes))
    assert ctl.last["step"] == pytest.approx(1.0 - dense_step + new, rel=1e-12)


def test_refit_is_off_under_a_nominal_link_or_a_null_tolerance() -> None:
    for ctl in (_controller(1e11, refit_tolerance=None), _controller(1e11, link="nominal")):
        if ctl.config.auto.link == "nominal":
            ctl.ctx = ControllerContext(**{**ctl.ctx.__dict__, "measure_link": None})
        step = ctl.tight_until
        ctl.accept(step, ctl.propose(step, 0.1))
        for s in range(step, step + ctl.interval):
            _observe(ctl, s, _signals(ctl), t_iter=10.0)
        ctl.before_proposal(step + ctl.interval)
        assert not [e for e in ctl.pop_events() if e["event"] == "auto_link_measured"]


@pytest.mark.parametrize("eta", [0.5, None])
def test_a_norm_change_at_an_unchanged_level_tightens_the_next_plan(eta: object) -> None:
    """Accordion's rule per group: the norm (√ interval-mean energy) doubling between two intervals at one level
    makes the decision tight (η 0.5); a group whose level changed between the intervals is not read; null: off."""
    ctl = _controller(1e8, detector_eta=eta, budget_tight=0.75)   # a tight plan that keeps one group's level
    step = ctl.tight_until
    ctl.accept(step, ctl.propose(step, 0.1))                      # quiet: a compressed plan
    for factor in (1.0, 4.0, 16.0):                               # energies ×1, then norms ×2, ×2 again
        for s in range(step, step + ctl.interval):
            _observe(ctl, s, _scaled(ctl, factor))
        step += ctl.interval
        steady = [g.name for g, a, b in zip(ctl.groups, ctl.prev_codes, ctl.codes) if a == b]
        tight = bool(ctl.propose(step, 0.1)[-1])
        ctl.accept(step, ctl.propose(step, 0.1))
        fired = [e["groups"] for e in ctl.pop_events() if e["event"] == "auto_norm_change"]
        if factor == 1.0 or eta is None:
            assert not tight and not fired, factor
        elif factor == 4.0:
            assert tight and fired == [steady] == [[g.name for g in ctl.groups]]
            assert ctl.tight_until == step + ctl.interval
            assert ctl.codes != ctl.prev_codes                    # the tight budget moved some groups
        else:
            assert tight and fired == [steady] and 0 < len(steady) < len(ctl.groups)
