"""The goodput controller's plan (``ds_gravac/adapt/auto/solver.py``): equal to brute force on small random
instances (ties included), the reference always feasible, deterministic, and the hysteresis rules."""
from __future__ import annotations

import itertools
import random
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds_gravac.adapt.auto.solver import Hysteresis, solve, totals
from auto_cases import instances, quarters

BRUTE_EXAMPLES = 400


def brute(times, errors, budget, caps=None) -> Optional[tuple]:
    """Every code vector: least time, then least error, then the smaller codes group by group (with ``caps``:
    only vectors whose every group's error is within its cap)."""
    best = None
    for codes in itertools.product(*[range(len(r)) for r in times]):
        t, e = totals(times, errors, codes)
        capped = caps is None or all(errors[g][c] <= caps[g] for g, c in enumerate(codes))
        if e <= budget and capped and (best is None or (t, e, codes) < best):
            best = (t, e, codes)
    return best


@settings(max_examples=BRUTE_EXAMPLES, deadline=None, derandomize=True)
@given(instances())
def test_equal_to_brute_force_on_small_instances(inst) -> None:
    times, errors, budget = inst
    want = brute(times, errors, budget)
    plan = solve(times, errors, budget)
    if want is None:
        assert not plan.feasible
        least = sum(min(r) for r in errors)
        assert plan.error == pytest.approx(least)
    else:
        assert plan.feasible and plan.exact
        assert (plan.time, plan.error, plan.codes) == want


@st.composite
def capped_instances(draw):
    times, errors, budget = draw(instances())
    return times, errors, budget, [draw(quarters) for _ in times]


@settings(max_examples=BRUTE_EXAMPLES, deadline=None, derandomize=True)
@given(capped_instances())
def test_per_group_caps_equal_to_brute_force(inst) -> None:
    """Caps only remove levels: the plan is brute force's over the vectors within every cap; without one, the
    least-error plan that stays within the caps wherever a group can, reported infeasible."""
    times, errors, budget, caps = inst
    want = brute(times, errors, budget, caps)
    plan = solve(times, errors, budget, caps=caps)
    if want is None:
        assert not plan.feasible
    else:
        assert plan.feasible and plan.exact
        assert (plan.time, plan.error, plan.codes) == want


def test_a_cap_keeps_one_group_from_spending_the_whole_budget() -> None:
    """The LSTM's failure in miniature: the summed budget lets the big group (cheap to compress hard) take all
    of it while the small one goes dense; its cap of twice its reference error forbids that corner."""
    times = [[1.0, 0.6, 0.3, 0.1], [0.2, 0.15, 0.1, 0.08], [0.2, 0.16, 0.1, 0.08]]     # dense, rank 16, 8, 2
    errors = [[0.0, 1.0, 1.8, 2.9]] * 3
    reference = (1, 1, 1)
    budget = totals(times, errors, reference)[1]          # 3.0: room for rank 2 on group 0 if the others go dense
    assert solve(times, errors, budget, reference=reference).codes == (3, 0, 0)
    caps = [2.0 * errors[g][c] for g, c in enumerate(reference)]
    plan = solve(times, errors, budget, reference=reference, caps=caps)
    assert plan.feasible and plan.codes == (2, 1, 0) and all(errors[g][c] <= caps[g] for g, c in enumerate(plan.codes))
    with pytest.raises(ValueError):
        solve(times, errors, budget, caps=[1.0])


def test_a_group_above_its_cap_frees_every_group_from_dwell() -> None:
    """A plan within the summed budget but with one group above its cap is violated: hysteresis moves it at once."""
    times = [[1.0, 0.3, 0.1], [1.0, 0.3, 0.1]]
    errors = [[0.0, 1.0, 3.0], [0.0, 1.0, 3.0]]
    h = Hysteresis(groups=2, min_gain=0.03, dwell=5)
    h.changed_at = [0, 0]                                     # both groups just changed: dwelling
    held, moved = h.step(1, (2, 0), times, errors, budget=3.0)
    assert held == (2, 0) and not moved
    codes, moved = h.step(1, (2, 0), times, errors, budget=3.0, caps=[2.0, 2.0])
    assert moved and all(errors[g][c] <= 2.0 for g, c in enumerate(codes))


@pytest.mark.parametrize("seed", range(40))
def test_equal_to_brute_force_on_random_floats(seed: int) -> None:
    rng = random.Random(seed)
    times = [sorted((rng.uniform(0, 1) for _ in range(rng.randint(1, 5))), reverse=True) for _ in range(6)]
    errors = [[0.0] + sorted(rng.uniform(0, 1) for _ in range(len(r) - 1)) for r in times]
    budget = rng.uniform(0, 3)
    plan, want = solve(times, errors, budget), brute(times, errors, budget)
    assert (plan.time, plan.error, plan.codes) == want


def ladder_instance(seed: int, groups: int = 23):
    """A ResNet101-sized instance: levels get cheaper and noisier down each ladder, dense (0) error-free."""
    rng = random.Random(seed)
    times, errors = [], []
    for _ in range(groups):
        k = rng.randint(5, 14)
        times.append(sorted((rng.uniform(0.001, 0.3) for _ in range(k)), reverse=True))
        errors.append([0.0] + sorted(rng.uniform(0, 1) for _ in range(k - 1)))
    return times, errors


@pytest.mark.parametrize("seed", range(10))
def test_the_reference_is_always_feasible_and_never_beaten_by_the_plan(seed: int) -> None:
    """With the budget at the reference's own error, the plan is never predicted slower or noisier."""
    times, errors = ladder_instance(seed)
    rng = random.Random(seed)
    ref = [rng.randrange(len(r)) for r in times]
    ref_t, ref_e = totals(times, errors, ref)
    plan = solve(times, errors, ref_e, reference=ref)
    assert plan.feasible and plan.time <= ref_t and plan.error <= ref_e
    tight = solve(times, errors, ref_e, reference=ref, frontier_cap=1)       # no exact search: the fallback
    assert not tight.exact and tight.feasible and tight.time <= ref_t and tight.error <= ref_e
    assert plan.time <= tight.time


def test_deterministic_and_order_of_calls_irrelevant() -> None:
    times, errors = ladder_instance(3)
    budget = totals(times, errors, [2] * len(times))[1]
    first = solve(times, errors, budget)
    solve(*ladder_instance(4), 1.0)
    again = solve([list(r) for r in times], [list(r) for r in errors], budget)
    assert first == again
    assert all(isinstance(c, int) for c in first.codes)


def test_fixed_groups_keep_their_code_and_bad_input_is_refused() -> None:
    times = [[3.0, 1.0], [3.0, 1.0]]
    errors = [[0.0, 1.0], [0.0, 1.0]]
    assert solve(times, errors, 1.0).codes == (0, 1)                        # tie: the lower group moves
    assert solve(times, errors, 1.0, fixed={1: 0}).codes == (1, 0)
    assert solve(times, errors, 2.0, fixed={0: 0}).codes == (0, 1)
    for bad in ([[1.0]], [[float("nan")]]), ([[1.0, 2.0]], [[0.0]]), ([[1.0]], [[-1.0]]):
        with pytest.raises(ValueError):
            solve(bad[0], bad[1], 1.0)
    with pytest.raises(ValueError):
        solve([[1.0]], [[0.0]], float("inf"))


def test_dwell_never_holds_a_plan_predicted_slower_than_a_feasible_reference() -> None:
    """A tight decision sends both groups dense; at the next, quiet one both still dwell, but the reference (both
    compressed, 0.4 s) now fits the budget: holding the 2 s dense plan would be predicted slower than the plan the
    controller promises never to lose to, so dwell gives way. While the reference does not fit, dwell holds."""
    times, errors, reference = [[1.0, 0.2], [1.0, 0.2]], [[0.0, 1.0], [0.0, 1.0]], (1, 1)
    h = Hysteresis(groups=2, min_gain=0.03, dwell=2)
    codes, moved = h.step(0, reference, times, errors, budget=0.5, reference=reference)     # tight: violated
    assert moved and codes == (0, 0)
    held, moved = h.step(1, codes, times, errors, budget=1.0, reference=reference)   # reference (error 2) misfits
    assert held == (0, 0) and not moved
    codes, moved = h.step(1, held, times, errors, budget=2.0, reference=reference)   # quiet: the reference fits
    assert moved and totals(times, errors, codes)[0] <= totals(times, errors, reference)[0]


def test_hysteresis_needs_three_percent_or_a_violated_budget_and_keeps_dwelling_groups() -> None:
    times = [[1.00, 0.98, 0.50], [1.0, 0.5]]
    errors = [[0.0, 0.1, 1.0], [0.0, 1.0]]
    h = Hysteresis(groups=2, min_gain=0.03, dwell=2)
    # 0.02 s of 2 s is 1%: no switch
    codes, moved = h.step(0, (0, 0), times, errors, budget=0.1)
    assert codes == (0, 0) and not moved
    # a budget that allows 0.5 s: 25% gain, switch
    codes, moved = h.step(1, (0, 0), times, errors, budget=1.0)
    assert moved and codes == (0, 1)
    # next decision: group 1 dwells, so only group 0 may move (and 1.0 + 1.0 > 1.5 would not fit anyway)
    codes2, moved2 = h.step(2, codes, times, errors, budget=2.0)
    assert codes2[1] == 1 and codes2 == (2, 1) and moved2
    # a violated budget frees every group at once, dwell or not
    codes3, moved3 = h.step(3, codes2, times, errors, budget=0.0)
    assert moved3 and codes3 == (0, 0)
    with pytest.raises(ValueError):
        Hysteresis(groups=1, min_gain=1.5)


def test_a_plan_must_beat_the_reference_by_min_gain_of_the_step() -> None:
    """The LSTM at 1 Gbit/s in miniature: a corner (group 0 compressed hard, group 1 dense) fits the budget and
    saves 0.006 s of exchange over the reference's 0.046 s — 13% of the exchange but 2% of a 0.28 s step, so the
    reference is the plan; with the compute unknown (0) or a saving of 5% of the step, the corner is."""
    times = [[0.040, 0.026, 0.010], [0.030, 0.020, 0.010]]      # dense, rank 16, rank 2
    errors = [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]
    reference = (1, 1)
    budget = totals(times, errors, reference)[1]
    corner = solve(times, errors, budget, reference=reference).codes
    assert corner != reference and totals(times, errors, corner)[0] < totals(times, errors, reference)[0]
    start = (0, 0)                                             # the tight phase's dense plan
    kept, _ = Hysteresis(groups=2).step(0, start, times, errors, budget, compute_s=0.234, reference=reference)
    assert kept == reference
    moved, _ = Hysteresis(groups=2).step(0, start, times, errors, budget, compute_s=0.0, reference=reference)
    assert moved == corner
    faster = [[0.040, 0.026, 0.001], [0.030, 0.020, 0.010]]    # the corner now saves 0.015 s: 5% of the step
    moved, _ = Hysteresis(groups=2).step(0, start, faster, errors, budget, compute_s=0.234, reference=reference)
    assert moved == solve(faster, errors, budget, reference=reference).codes != reference
