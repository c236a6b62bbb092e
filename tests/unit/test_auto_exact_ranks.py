"""``mode: "auto"``'s measured trial of a mixed plan, and exact ranks: a group a rank sends exactly (on every
step of the dense start) is referenced and capped there."""
from __future__ import annotations

import pytest

from ds_gravac.adapt.auto.budget import exact_reference
from ds_gravac.adapt.auto.ladder import LOWRANK, RANKS, Level, uniform_codes
from ds_gravac.adapt.auto.signals import GroupErrors
from ds_gravac.config import AutoConfig
from ds_gravac.sync.aggregate_gain import GroupSignal
from ds_gravac.sync.cost_model.fits import ALL_REDUCE
from auto_cases import _controller, _interval, _observe, _signals


# ---- the measured trial of a mixed plan -------------------------------------------------------------------------
@pytest.mark.parametrize("hold_max", [16, 0])
def test_a_mixed_plan_not_measured_faster_than_the_reference_holds_it(hold_max: int) -> None:
    """100 Mbit/s, a steep group and no caps: the quiet plan is mixed. Its first interval is followed by one of the reference (the control,
    1.0 s); a mixed interval measured only 1% faster holds the reference for 1, then 2 decisions; one measured 10%
    faster keeps the mixed plan. With ``trial_hold_max`` 0 the measured steps change nothing."""
    keys: dict = {"steep": "512x4608", "group_cap": None, "refit_tolerance": None, "trial_hold_max": hold_max}
    ctl = _controller(1e8, **keys)
    step = ctl.tight_until
    ctl.accept(step, ctl.propose(step, 0.1))
    # the reference in force: the steep group (u ≈ 0.008 at rank 64) is measured exact there (``exact_reference``)
    mixed, ref = list(ctl.codes), ctl._reference_now(ctl.signals)
    assert mixed != ref
    plans = []
    for seconds in (0.99, 1.0, 0.99, 1.0, 0.99, 1.0, 1.0, 0.9, 0.9):
        step = _interval(ctl, step, seconds, keys["steep"])
        plans.append("M" if ctl.codes == mixed else "R" if ctl.codes == ref else "?")
    failed = [e for e in ctl.pop_events() if e["event"] == "auto_trial_failed"]
    if hold_max:
        #        control  trial  fail  trial  fail: 2 decisions  trial  pays   keeps
        assert plans == ["R", "M", "R", "M", "R", "R", "M", "M", "M"]
        assert [e["hold"] for e in failed] == [1, 2] and failed[0]["reference_step"] == 1.0
        assert ctl.telemetry()["auto/hold"] == 0
    else:
        assert plans == ["M"] * 9 and not failed
    other = _controller(1e8, **keys)
    other.load_state_dict(ctl.state_dict())
    assert other.trial == ctl.trial


def test_the_first_re_timing_compares_the_link_with_attach_s() -> None:
    """The trial check's link baseline is the link measured at attach: a link 100x slower at the first re-timing
    forgets the reference's step and any hold at once (before, that re-timing only became the baseline)."""
    keys: dict = {"steep": "512x4608", "group_cap": None, "refit_tolerance": None}
    ctl = _controller(1e8, remeasured_bit_s=1e6, **keys)
    attach_b = ctl.ctx.cost_fits().get(ALL_REDUCE).b
    step = ctl.tight_until
    ctl.accept(step, ctl.propose(step, 0.1))
    assert ctl.codes != ctl.reference
    ctl.trial.ref_steps, ctl.trial.hold = [1.0], 3                  # a held reference, measured on the old link
    for s in range(step, step + ctl.interval):
        _observe(ctl, s, _signals(ctl, keys["steep"]), t_iter=1.0)
    ctl.before_proposal(step + ctl.interval)
    resets = [e for e in ctl.pop_events() if e["event"] == "auto_trial_reset"]
    assert len(resets) == 1 and resets[0]["all_reduce_b"] == pytest.approx(100.0 * attach_b, rel=1e-9)
    assert (ctl.trial.ref_step, ctl.trial.hold, ctl.trial.backoff) == (0.0, 0, 1)


@pytest.mark.parametrize("rate_bit_s", [1e7, 1e8])
def test_a_group_a_rank_sends_exactly_is_referenced_and_capped_there(rate_bit_s: float) -> None:
    """A 512 × 4608 class whose gradient has rank 64 (rank 64 sends it exactly, rank 16 leaves 29% unsent): its
    reference becomes rank 64 with zero error, so with the default caps it goes exact or dense — on a slow link,
    where the rank-16 reference would let it go to rank 16 or below — and the other groups keep their
    budget (the summed budget is theirs alone)."""
    ctl = _controller(rate_bit_s, exact="512x4608")
    target = next(g for g in ctl.groups if g.name == "512x4608")
    quiet = ctl.tight_until
    ctl.accept(quiet, ctl.propose(quiet, 0.1))
    plan = [e for e in ctl.pop_events() if e["event"] == "auto_plan"][-1]
    level = target.ladder[ctl.codes[target.index]]
    assert level in (target.ladder[0], Level(LOWRANK, 64.0))
    assert level != target.ladder[0]                  # dense bytes are far slower than rank 64 on these links
    assert plan["reference_error"][target.index] == 0.0 and plan["error"][target.index] == 0.0
    others = [g.index for g in ctl.groups if g.index != target.index]
    r16 = uniform_codes(ctl.groups, Level(LOWRANK, 16.0))
    _, errors = ctl._tables(ctl.signals)
    assert ctl.last["ref_error"] == pytest.approx(sum(errors[g][r16[g]] for g in others), rel=1e-12)


def test_exactness_is_a_measured_fraction_at_most_exact_fraction() -> None:
    """``u ≤ auto.exact_fraction`` counts as exact for a class of 2-D weights, twice that does not (nor anything
    at 0: off, nor a convolution), and the smallest exact rank wins; the rungs at
    and above it count no error; an exact rung replaces a reference rung with error, and a reference rung already
    exact is kept."""
    ctl = _controller(1e8)
    ctl.signals.close_interval()
    g = next(g for g in ctl.groups if g.name == "512x4608")
    r64, r32, r16 = (g.code(Level(LOWRANK, r)) for r in (64.0, 32.0, 16.0))
    ctl.signals.worst[g.index][RANKS.index(64)] = 0.0
    line = AutoConfig().exact_fraction
    assert ctl.signals.exact_ranks(ctl.groups, 0.0) == [0] * len(ctl.groups)
    stem = next(g for g in ctl.groups if g.name == "64x147")        # a convolution: never exact (2-D weights only)
    ctl.signals.worst[stem.index][RANKS.index(16)] = 0.0
    assert not stem.linear and g.linear and ctl.signals.exact_ranks(ctl.groups, line)[stem.index] == 0
    for frac, exact in ((line, 32), (2 * line, 64)):
        ctl.signals.worst[g.index][RANKS.index(32)] = frac
        ranks = ctl.signals.exact_ranks(ctl.groups, line)
        assert ranks[g.index] == exact and all(r == 0 for i, r in enumerate(ranks) if i != g.index)
        row = ctl.signals.errors(ctl.groups, ranks)[g.index]
        assert (row[r64], row[r32] == 0.0, row[r16] > 0.0) == (0.0, exact == 32, True)
    errors = [[0.0 if lv.family == "dense" else 1.0 for lv in grp.ladder] for grp in ctl.groups]
    errors[g.index][r64] = errors[g.index][r32] = 0.0
    assert exact_reference(ctl.groups, errors, ctl.reference)[g.index] == r32
    errors[g.index][r32] = 0.5
    assert exact_reference(ctl.groups, errors, ctl.reference)[g.index] == r64
    others = [i for i in range(len(ctl.groups)) if i != g.index]
    new = exact_reference(ctl.groups, errors, ctl.reference)
    assert [new[i] for i in others] == [ctl.reference[i] for i in others]     # the other groups keep rank 16
    errors[g.index][r16] = 0.0
    assert exact_reference(ctl.groups, errors, ctl.reference) == ctl.reference


def test_exactness_holds_on_every_step_not_on_the_sums() -> None:
    """One dense-start step of a huge gradient that rank 2 sends to 10⁻⁴ dominates the interval's sums (10⁻⁴
    unsent there) while rank 2 leaves a quarter of every other step unsent: no rank of that class is exact (the
    LSTM's 2600 × 650 class after 50 dense steps). When every step is within the line, the smallest rank is."""
    groups = _controller(1e8).groups
    g = next(g for g in groups if g.name == "512x4608")

    def observe(errs: GroupErrors, energy: float, unsent: float) -> None:
        out = [GroupSignal(den=1.0, applied=1.0, prefix=(None,) * len(RANKS)) for _ in groups]
        out[g.index] = GroupSignal(den=energy, applied=energy, prefix=(energy * (1.0 - unsent),) * len(RANKS))
        errs.add(out)

    line = AutoConfig().exact_fraction
    spiky, bounded = GroupErrors(groups, RANKS), GroupErrors(groups, RANKS)
    observe(spiky, 1e6, 1e-4)
    for _ in range(5):
        observe(spiky, 1.0, 0.25)
        observe(bounded, 1.0, line / 2)
    for errs in (spiky, bounded):
        errs.close_interval()
    assert spiky.frac[g.index][RANKS.index(2)] < line          # the sums alone would call rank 2 exact
    assert spiky.exact_ranks(groups, line)[g.index] == 0
    assert bounded.exact_ranks(groups, line)[g.index] == 2
    restored = GroupErrors(groups, RANKS)
    restored.load_state_dict(spiky.state_dict())
    assert restored.exact_ranks(groups, line)[g.index] == 0 and restored.worst == spiky.worst


def test_exactness_is_read_from_the_dense_start_and_kept() -> None:
    """The first decision reads the exact ranks from the dense start; later intervals whose fraction at that rank
    grew (error feedback's residual, which a rank equal to the bound does not send) keep it, and so does a resume."""
    ctl = _controller(1e8, exact="512x4608")
    g = next(g for g in ctl.groups if g.name == "512x4608")
    step = ctl.tight_until
    ctl.accept(step, ctl.propose(step, 0.1))
    assert ctl.exact[g.index] == 64 and sum(ctl.exact) == 64
    for s in range(step, step + 3):
        _observe(ctl, s, _signals(ctl))                 # rank 64 now leaves a fraction unsent
    step += ctl.interval
    ctl.accept(step, ctl.propose(step, 0.1))
    assert ctl.exact[g.index] == 64
    plan = [e for e in ctl.pop_events() if e["event"] == "auto_plan"][-1]
    assert plan["unsent"][g.index][0] > AutoConfig().exact_fraction and plan["reference_error"][g.index] == 0.0
    assert ctl.groups[g.index].ladder[ctl.codes[g.index]] == Level(LOWRANK, 64.0)
    other = _controller(1e8)
    other.load_state_dict(ctl.state_dict())
    assert other.exact == ctl.exact
