"""``auto.tight_time_slack``: a tight phase's error budget bounded by time (``budget.time_bounded_total``), against
brute force over every code vector on small instances, and in the controller on a slow and a fast link."""
from __future__ import annotations

import itertools
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds_gravac.adapt.auto.budget import error_budget
from ds_gravac.adapt.auto.solver import solve, totals
from ds_gravac.config import parse_config
from auto_cases import _controller, instances

EXAMPLES = 300


def vectors(times):
    return itertools.product(*[range(len(r)) for r in times])


def within(errors, codes, caps: Optional[list[float]]) -> bool:
    return caps is None or all(errors[g][c] <= caps[g] for g, c in enumerate(codes))


def brute_total(times, errors, reference, beta_quiet, beta_tight, slack, compute_s, cap) -> float:
    """The definition, by enumeration: the quiet budget and caps from the reference; the quiet plan's time (least
    Σt within them); the bound ``t_q + slack·(compute + t_q)``; the least Σe within the caps and the bound; never
    below the tight budget."""
    ref_e = totals(times, errors, reference)[1]
    caps = None if cap is None else [cap * beta_quiet * errors[g][c] for g, c in enumerate(reference)]
    quiet = [totals(times, errors, v) for v in vectors(times)
             if totals(times, errors, v)[1] <= beta_quiet * ref_e and within(errors, v, caps)]
    t_q = min(t for t, _ in quiet)        # the reference itself fits, so never empty
    bound = t_q + slack * (compute_s + t_q)
    least = min(e for t, e in (totals(times, errors, v) for v in vectors(times) if within(errors, v, caps))
                if t <= bound)
    return max(beta_tight * ref_e, least)


@st.composite
def cases(draw):
    times, errors, _ = draw(instances())
    reference = [draw(st.integers(0, len(row) - 1)) for row in times]
    beta_tight = draw(st.sampled_from([0.0, 0.25, 0.5]))
    slack = draw(st.sampled_from([0.0, 0.05, 0.25, 1.0]))
    compute_s = draw(st.sampled_from([0.0, 1.0, 4.0]))
    cap = draw(st.sampled_from([None, 2.0]))
    return times, errors, reference, beta_tight, slack, compute_s, cap


def auto_section(beta_tight: float, slack: Optional[float], cap: Optional[float]):
    return parse_config({"mode": "auto", "compressor": "powersgd",
                         "auto": {"budget_tight": beta_tight, "tight_time_slack": slack, "group_cap": cap}}).auto


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(cases())
def test_the_tight_budget_equals_brute_force_and_its_plan_keeps_the_step(case) -> None:
    times, errors, reference, beta_tight, slack, compute_s, cap = case
    auto = auto_section(beta_tight, slack, cap)
    budget = error_budget(auto, "lowrank", times, errors, reference, True, compute_s=compute_s)
    want = brute_total(times, errors, reference, 1.0, beta_tight, slack, compute_s, cap)
    assert budget.total == pytest.approx(want, abs=1e-12)
    # the tight phase's plan, under that budget and the quiet caps, is no slower than the bound
    quiet = error_budget(auto, "lowrank", times, errors, reference, False)
    assert budget.caps == quiet.caps
    t_q = solve(times, errors, quiet.total, reference=reference, caps=quiet.caps).time
    plan = solve(times, errors, budget.total, reference=reference, caps=budget.caps)
    assert plan.feasible
    assert plan.time <= t_q + slack * (compute_s + t_q) + 1e-12
    # never looser than the quiet budget; without the key, the fixed tight β as before
    assert budget.total <= quiet.total + 1e-12
    fixed = error_budget(auto_section(beta_tight, None, cap), "lowrank", times, errors, reference, True)
    assert fixed.total == pytest.approx(beta_tight * totals(times, errors, reference)[1], abs=1e-12)
    assert budget.total >= fixed.total - 1e-12


def test_where_time_allows_the_tight_budget_is_unchanged() -> None:
    """Dense costs the same as the reference here (a fast link, say): the tight β stands."""
    times, errors = [[1.0, 1.0], [1.0, 1.0]], [[0.0, 2.0], [0.0, 3.0]]
    auto = auto_section(0.25, 0.05, None)
    assert error_budget(auto, "lowrank", times, errors, [1, 1], True).total == pytest.approx(0.25 * 5.0)


def test_a_larger_slack_never_loosens_the_budget() -> None:
    """Worked by hand: the reference (codes 2, 1, 1) is also the quiet plan, 6 s and error 9; with 2 s of compute
    the bound is 6 + slack·8 s, and the least error within it 9 (slack 0 and 0.1), 5 (10 s: codes 2, 1, 0),
    and 3 (14 s: codes 1, 1, 0 at 12 s)."""
    times = [[8.0, 4.0, 2.0, 1.0], [6.0, 3.0, 1.5], [5.0, 1.0]]
    errors = [[0.0, 1.0, 3.0, 7.0], [0.0, 2.0, 5.0], [0.0, 4.0]]
    got = [error_budget(auto_section(0.0, s, None), "lowrank", times, errors, [2, 1, 1], True, compute_s=2.0).total
           for s in (0.0, 0.1, 0.5, 1.0)]
    assert got == [9.0, 9.0, 5.0, 3.0]


@pytest.mark.parametrize("slack", [0.05, 0.25])
def test_in_the_controller_a_slow_links_tight_phase_stays_within_the_slack(slack: float) -> None:
    """100 Mbit/s: the fixed tight β plans a step more than the slack slower than the quiet plan; bounded by time,
    the tight plan is within it and compresses more than the fixed one. At 100 Gbit/s both tight phases plan the
    same (dense is cheap)."""
    def first_plans(rate: float, **keys: object):
        ctl = _controller(rate, **keys)
        ctl.accept(0, ctl.propose(0, 0.1))                 # the start: tight
        tight_time, tight_codes = ctl.last["time"], list(ctl.codes)
        ctl.accept(ctl.tight_until, ctl.propose(ctl.tight_until, 0.1))
        return tight_time, tight_codes, ctl.last["time"], ctl

    fixed_t, fixed_codes, quiet_t, ctl = first_plans(1e8)
    assert ctl.tight is False and fixed_t > (1.0 + slack) * quiet_t
    bounded_t, bounded_codes, _, _ = first_plans(1e8, tight_time_slack=slack)   # (its quiet plan: within min_gain)
    assert bounded_t <= (1.0 + slack) * quiet_t * (1.0 + 1e-9) and bounded_t < fixed_t
    assert bounded_codes != fixed_codes
    fast_fixed, fast_codes, _, _ = first_plans(1e11)
    fast_bounded, fast_bounded_codes, _, _ = first_plans(1e11, tight_time_slack=slack)
    assert fast_bounded_codes == fast_codes and fast_bounded == pytest.approx(fast_fixed)
