"""``auto``'s measured check on mixed plans (``adapt/auto/trial.py``): a plan other than the reference is a trial the
measured steps must keep."""
from __future__ import annotations

import pytest

from ds_gravac.adapt.auto.trial import LINK_CHANGE, REF_KEPT, TrialCheck

REF = [1, 1, 1]
MIXED = [1, 3, 0]


def _check(hold_max: int = 16) -> TrialCheck:
    return TrialCheck(min_gain=0.03, hold_max=hold_max)


def test_the_reference_interval_is_the_control_and_a_trial_must_beat_it_by_min_gain() -> None:
    check = _check()
    assert check.judge(REF, REF, quiet=True, measured=1.0) is None and check.ref_step == 1.0
    assert check.judge(MIXED, REF, quiet=True, measured=0.97) is False          # exactly 3% faster: it pays
    assert not check.holding and check.backoff == 1
    assert check.judge(MIXED, REF, quiet=True, measured=0.975) is True          # 2.5% faster: not enough
    assert check.holding and check.hold == 1 and check.backoff == 2


def test_a_trial_must_also_beat_the_fastest_of_the_reference_s_last_intervals() -> None:
    """Reference intervals measured 1.10, 0.90, 1.00 (median 1.00, spread ±10%): a trial 5% under the median is
    inside that spread and fails; one at 0.90 pays. Only the last ``REF_KEPT`` (3) reference intervals count."""
    check = _check()
    for measured in (0.5, 1.10, 0.90, 1.00):      # 0.5 is the oldest: dropped once three more are kept
        check.judge(REF, REF, quiet=True, measured=measured)
    assert REF_KEPT == 3 and check.ref_steps == [1.10, 0.90, 1.00] and check.ref_step == 1.00
    assert check.judge(MIXED, REF, quiet=True, measured=0.95) is True
    check.hold = 0
    assert check.judge(MIXED, REF, quiet=True, measured=0.90) is False


def test_a_state_saved_with_one_reference_step_loads() -> None:
    check = _check()
    check.load_state_dict({"ref_step": 1.5, "hold": 2, "backoff": 4, "link_b": 1e-8})
    assert (check.ref_steps, check.hold, check.backoff, check.link_b) == ([1.5], 2, 4, 1e-8)
    check.load_state_dict({"ref_step": 0.0})
    assert check.ref_steps == []


def test_failed_trials_back_off_doubling_up_to_hold_max_and_a_paying_one_resets() -> None:
    check = _check(hold_max=4)
    check.judge(REF, REF, quiet=True, measured=1.0)
    holds = []
    for _ in range(4):
        assert check.judge(MIXED, REF, quiet=True, measured=1.0) is True
        holds.append(check.hold)
        while check.holding:                # the held decisions run the reference: quiet ones spend the hold
            check.spend(quiet=False)        # a tight decision does not
            check.spend(quiet=True)
    assert holds == [1, 2, 4, 4]
    assert check.judge(MIXED, REF, quiet=True, measured=0.5) is False and check.backoff == 1


def test_tight_or_unmeasured_intervals_are_not_judged_and_the_first_trial_runs_a_control() -> None:
    check = _check()
    assert check.judge(MIXED, REF, quiet=False, measured=2.0) is None and not check.holding
    assert check.judge(MIXED, REF, quiet=True, measured=None) is None and not check.holding
    assert check.judge(MIXED, REF, quiet=True, measured=1.0) is None         # no control yet: run the reference
    assert check.holding and check.hold == 1 and check.backoff == 1
    check.spend(quiet=True)
    assert check.judge(REF, REF, quiet=False, measured=5.0) is None and check.ref_step == 0.0   # tight: no control


def test_hold_max_zero_is_off() -> None:
    check = _check(hold_max=0)
    check.judge(REF, REF, quiet=True, measured=1.0)
    assert check.judge(MIXED, REF, quiet=True, measured=2.0) is None and not check.holding


@pytest.mark.parametrize("factor, reset", [(1.5, False), (LINK_CHANGE, True), (1.0 / LINK_CHANGE, True)])
def test_a_link_that_changed_by_2x_forgets_the_control_and_the_hold(factor: float, reset: bool) -> None:
    check = _check()
    assert check.link_measured(8e-8) is False                   # the first timing is the baseline
    check.judge(REF, REF, quiet=True, measured=1.0)
    check.judge(MIXED, REF, quiet=True, measured=1.0)
    assert check.holding
    assert check.link_measured(8e-8 * factor) is reset
    assert check.holding is not reset and (check.ref_step == 0.0) is reset


def test_state_round_trip() -> None:
    check = _check()
    check.link_measured(1e-8)
    check.judge(REF, REF, quiet=True, measured=1.0)
    check.judge(MIXED, REF, quiet=True, measured=1.0)
    check.judge(MIXED, REF, quiet=True, measured=1.0)
    other = _check()
    other.load_state_dict(check.state_dict())
    assert other == check
