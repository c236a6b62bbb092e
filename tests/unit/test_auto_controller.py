"""``mode: "auto"`` in one process: its config keys (each error names the key, the value and the allowed range;
the documented defaults are the code's), and the controller's plan against an injected link — the same signals
compress more on a slow link than on a fast one (the "link change re-plans" test at unit level)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ds_gravac.adapt.auto.controller import PLAIN, AutoController
from ds_gravac.adapt.auto.budget import exact_reference
from ds_gravac.adapt.auto.ladder import LOWRANK, RANKS, Level, uniform_codes
from ds_gravac.adapt.auto.signals import GroupErrors
from ds_gravac.adapt.auto.timing import Pricer, link_fits
from ds_gravac.adapt.base import ControllerContext
from ds_gravac.config import AutoConfig, parse_config
from ds_gravac.errors import GravacConfigError
from ds_gravac.sync.aggregate_gain import AggregateSample, GroupSignal
from ds_gravac.sync.cost_model.fits import ALL_REDUCE, FitTable
from ds_gravac.telemetry.stats import AgreedStats

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


# ---- config ----------------------------------------------------------------------------------------------------
def test_mode_auto_is_a_choice_not_an_unset_value() -> None:
    """``"auto"`` means "not set" for every other key (Hugging Face); for ``mode`` it names the controller."""
    assert parse_config({"mode": "auto", "compressor": "powersgd"}).mode == "auto"
    assert parse_config({"cf": "auto"}).static_cf() == 100


@pytest.mark.parametrize("key, value, allowed", [
    ("interval_steps", 0, "greater than or equal to 1"),
    ("warmup_steps", -1, "greater than or equal to 0"),
    ("tight_steps", -2, "greater than or equal to 0"),
    ("dwell", 1001, "less than or equal to 1000"),
    ("min_gain", 1.0, "less than 1"),
    ("budget_quiet", 0.0, "greater than 0"),
    ("budget_tight", -0.5, "greater than or equal to 0"),
    ("pin_below_numel", -1, "greater than or equal to 0"),
    ("link_gbit_s", 0.0, "greater than 0"),
    ("link_alpha_s", 2.0, "less than or equal to 1"),
    ("link", "guess", "'measure' or 'nominal'"),
    ("interval_steps", "50", "valid integer"),
])
def test_auto_key_errors_name_key_value_and_range(key: str, value: object, allowed: str) -> None:
    with pytest.raises(GravacConfigError) as info:
        parse_config({"mode": "auto", "auto": {key: value}})
    text = str(info.value)
    assert f"key auto.{key}:" in text and allowed in text and f"input_value={value!r}" in text


def test_auto_unknown_key_and_cross_rule() -> None:
    with pytest.raises(GravacConfigError, match=r"(?s)key auto\.interval: .*Extra inputs are not permitted"):
        parse_config({"mode": "auto", "auto": {"interval": 5}})
    with pytest.raises(GravacConfigError, match=r"auto\.budget_tight \(2\) must be <= auto\.budget_quiet \(1\)"):
        parse_config({"mode": "auto", "auto": {"budget_tight": 2.0}})


@pytest.mark.parametrize("compressor", ["qsgd", "topk"])
def test_shared_buckets_need_a_low_rank_compressor(compressor: str) -> None:
    """A quantizer or a sparsifier encodes a bucket at one level: ``auto.buckets: "shared"`` is refused before
    training, naming the key, the value and what is allowed; over PowerSGD it asks for groups that share buckets."""
    with pytest.raises(GravacConfigError, match=r"auto\.buckets 'shared' needs a low-rank compressor .*"
                                                rf"{compressor!r}.*allowed with it: 'groups'"):
        parse_config({"mode": "auto", "compressor": compressor, "auto": {"buckets": "shared"}})
    shapes = [("a.weight", (64, 64, 3, 3)), ("b.weight", (128, 64, 3, 3)), ("fc.weight", (10, 128))]
    for buckets, bucketed in (("groups", True), ("shared", False)):
        ctl = AutoController(parse_config({"mode": "auto", "compressor": "powersgd", "auto": {"buckets": buckets}}))
        assert ctl.signal_groups(shapes).bucketed is bucketed, buckets


def test_auto_refuses_other_compressors_at_attach() -> None:
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError, match=r"mode 'auto' .* supports powersgd, qsgd, topk .* not 'randomk' .*\"compressor\""):
        build_compressor(parse_config({"mode": "auto", "compressor": "randomk"}))
    with pytest.raises(GravacConfigError, match=r'key "compressor.params.rank" \(8\) is not read by mode .auto.'):
        build_compressor(parse_config({"mode": "auto", "compressor": {"type": "powersgd", "params": {"rank": 8}}}))
    comp = build_compressor(parse_config({"mode": "auto", "compressor": "powersgd"}))
    assert (comp.level_kind, comp.bound) == ("rank", float(RANKS[0]))
    with pytest.raises(GravacConfigError, match=r'key "compressor.params.levels" \(7\) is not read by mode .auto.'):
        build_compressor(parse_config({"mode": "auto", "compressor": {"type": "qsgd", "params": {"levels": 7}}}))
    with pytest.raises(GravacConfigError, match=r'key "compressor.params.error_feedback" \(true\) is refused'):
        build_compressor(parse_config({"mode": "auto", "compressor": {"type": "qsgd",
                                                                      "params": {"error_feedback": True}}}))
    assert build_compressor(parse_config({"mode": "auto", "compressor": "qsgd"})).name == "qsgd"


@pytest.mark.parametrize("section, key", [({"compressor": "topk", "cf": 10}, "cf"),
                                          ({"compressor": "powersgd", "warmup_steps": 20}, "warmup_steps")])
def test_static_keys_are_refused_under_auto_not_ignored(section: dict, key: str) -> None:
    """``cf`` and the top-level ``warmup_steps`` are static mode's; auto never read them, so a user who set them
    trained without what they asked for. Attach refuses them and names auto's own key where there is one."""
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError, match=rf'key "{key}" .* is static mode.s and is not read by mode .auto.'):
        build_compressor(parse_config({"mode": "auto", **section}))
    assert build_compressor(parse_config({"mode": "static", **section})).name == section["compressor"]
    assert "defaults to 'auto'" not in str(pytest.raises(GravacConfigError, build_compressor,
                                                         parse_config({"mode": "auto", **section})).value)
    with pytest.raises(GravacConfigError, match=rf'key "{key}" .* remove it; "mode" is not set and defaults to '
                                                r"'auto' since 0.5: set \"mode\": \"static\""):
        build_compressor(parse_config(section))       # a 0.4 section that relied on the static default


def test_a_compressor_auto_does_not_drive_names_the_default_mode() -> None:
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError, match=r"not 'dgc'.*\"mode\" is not set and defaults to 'auto'"):
        build_compressor(parse_config({"compressor": "dgc"}))
    assert build_compressor(parse_config({"mode": "static", "compressor": "dgc"})).name == "dgc"


def test_the_dense_rung_sends_a_matrix_plain_and_a_rank_rung_at_its_rank() -> None:
    """What PowerSGD, bound by auto's mode, makes of the levels the controller gives a tensor."""
    from ds_gravac.adapt.auto.ladder import build_groups
    from ds_gravac.integration.engine import build_compressor

    comp = build_compressor(parse_config({"mode": "auto", "compressor": "powersgd"}))
    for group in build_groups(SHAPES, families=(LOWRANK,)):
        n, m = group.shape
        plain = comp.tensor_plan((n, m), PLAIN)
        assert (plain.get("rank"), plain.words) == (0, n * m), group.name          # its values, no factors
        for level in group.ladder[1:]:
            assert comp.tensor_plan((n, m), level.value).get("rank") == int(level.value), (group.name, level)


def test_the_default_dense_start_is_one_interval() -> None:
    """Since 0.5 ``{}`` sends steps 0-49 dense and decides first at step 50: without that start ``auto`` and its
    reference rank 16 ended outside the bounds on VGG16-bn (docs/algorithms.md §8, "On the short tasks")."""
    ctl = AutoController(parse_config({}))
    assert (ctl.start, ctl.interval) == (50, 50)
    assert [s for s in range(151) if ctl.broadcast_point(s)] == [50, 100, 150]
    assert all(ctl.measures(s) for s in range(50))              # exact ranks read the whole dense start
    assert AutoController(parse_config({"auto": {"warmup_steps": 0}})).start == 2


def test_documented_auto_defaults_are_the_codes() -> None:
    """Every ``auto.*`` row of docs/configuration.md states the default the schema has."""
    rows = re.findall(r"^\| `auto\.(\w+)` \| `([^`]+)`", DOCS.read_text(), flags=re.M)
    documented = {k: v for k, v in rows}
    assert set(documented) == set(AutoConfig.model_fields)
    for key, field in AutoConfig.model_fields.items():
        assert json.loads(documented[key]) == field.default, key


# ---- the plan against an injected link ---------------------------------------------------------------------------
SHAPES = [("stem.weight", (64, 3, 7, 7)), *[(f"a{i}.weight", (256, 2304)) for i in range(4)],
          *[(f"b{i}.weight", (512, 4608)) for i in range(3)], ("fc.weight", (100, 2048))]


def _signals(ctl: AutoController, steep: str = "") -> tuple[GroupSignal, ...]:
    """A dense step's signals: every group's energy and prefix energies of a spectrum ‖c_k‖² ∝ 1/k (group
    ``steep``: ∝ 1/k², at a tenth of the energy — cheap to compress hard, as the LSTM's embedding was)."""
    out = []
    for g in ctl.groups:
        n, m = g.shape
        width = min(n, m, RANKS[0])
        power = 2.0 if g.name == steep else 1.0
        spectrum = [1.0 / k ** power for k in range(1, min(n, m) + 1)]
        energy = (1.0 if g.name == steep else 10.0) * g.count
        scale = energy / sum(spectrum)
        prefix = tuple(scale * sum(spectrum[:r]) if r <= width else None for r in RANKS)
        out.append(GroupSignal(den=energy, applied=energy, prefix=prefix))
    return tuple(out)


def _controller(rate_bit_s: float, remeasured_bit_s: float = 0.0, steep: str = "", dense_bytes: int = 4,
                exact: str = "", **keys: object) -> AutoController:
    """Signals of three steps observed; the link at ``rate_bit_s``, re-timed at ``remeasured_bit_s`` (every
    decision after the first) when given; group ``exact`` has a rank-64 gradient (``_exact_signals``); ``keys``
    override the ``auto`` section."""
    auto = {"interval_steps": 10, "dwell": 0, "remeasure_decisions": 1 if remeasured_bit_s else 0, **keys}
    ctl = AutoController(parse_config({"mode": "auto", "compressor": "powersgd", "auto": auto}))
    ctl.signal_groups(SHAPES)
    fits = FitTable(link_fits(rate_bit_s, 1e-4, 2))
    later = FitTable(link_fits(remeasured_bit_s or rate_bit_s, 1e-4, 2))
    ctl.bind(ControllerContext(world_size=2, samples_per_step=32, realize_cf=float, cf_grid=None,
                               multilevel="none", gain_kind="projection", level_kind="rank",
                               compressible=tuple(n for n, _ in SHAPES), cost_fits=lambda: fits,
                               measure_link=lambda: later, dense_bytes_per_element=dense_bytes))
    for step in range(3):
        _observe(ctl, step, _exact_signals(ctl, exact, 64) if exact else _signals(ctl, steep))
    return ctl


def _observe(ctl: AutoController, step: int, signals: tuple, t_iter: float = 0.0) -> None:
    """One step's agreed statistics: the group signals of ``step`` and the measured time of the step before."""
    sample = AggregateSample(step=step, levels=(), den=0.0, nums=(), groups=signals)
    ctl.observe(AgreedStats(step=step + 1, decision=None, den=0.0, den_raw=0.0, nums=(), t_iter_prev=t_iter,
                            t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=0.0, world_size=2,
                            aggregate=sample))


def _plan(rate_bit_s: float) -> tuple[AutoController, list[int], float]:
    ctl = _controller(rate_bit_s)
    quiet = ctl.tight_until                     # the first decision after the tight start
    proposal = ctl.propose(quiet, 0.1)
    ctl.accept(quiet, proposal)
    codes = ctl.codes
    payload = Pricer(FitTable(link_fits(rate_bit_s, 1e-4, 2)), 2).payload(ctl.groups, codes)
    return ctl, codes, payload


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
def _exchange_s(rate_bit_s: float, groups: list, codes: list[int]) -> float:
    """The plan's exchange seconds, summed here from the pricer's per-level times."""
    return sum(row[c] for row, c in zip(Pricer(FitTable(link_fits(rate_bit_s, 1e-4, 2)), 2).times(groups), codes))


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


def _scaled(ctl: AutoController, factor: float) -> tuple:
    return tuple(GroupSignal(den=s.den * factor, applied=s.applied * factor,
                             prefix=tuple(None if p is None else p * factor for p in s.prefix)) for s in _signals(ctl))


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


# ---- the measured trial of a mixed plan -------------------------------------------------------------------------
def _interval(ctl: AutoController, step: int, seconds: float, steep: str = "") -> int:
    """One interval of steps measured at ``seconds`` each; then the decision at its end. Returns that step."""
    for s in range(step, step + ctl.interval):
        _observe(ctl, s, _signals(ctl, steep), t_iter=seconds)
    step += ctl.interval
    ctl.before_proposal(step)
    ctl.accept(step, ctl.propose(step, 0.1))
    return step


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


def _exact_signals(ctl: AutoController, exact: str, rank: int) -> tuple[GroupSignal, ...]:
    """``_signals``, except that group ``exact`` has a gradient of rank ``rank`` (as a fully connected layer fed
    ``rank`` samples has), its spectrum ∝ 1/k up to there."""
    out = list(_signals(ctl))
    g = next(g for g in ctl.groups if g.name == exact)
    energy = 10.0 * g.count
    spectrum = [1.0 / k for k in range(1, rank + 1)]
    prefix = tuple(energy * sum(spectrum[:r]) / sum(spectrum) for r in RANKS)
    out[g.index] = GroupSignal(den=energy, applied=energy, prefix=prefix)
    return tuple(out)


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
