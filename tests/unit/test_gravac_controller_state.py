"""GraVAC controller (docs/algorithms.md): gain estimators, timings, checkpoint round trips, attach checks and
defaults, from scripted gain/time streams. Expected values are derived from docs/algorithms.md, not from the
implementation's output."""
from __future__ import annotations

import json
import logging
import math

import pytest

from ds_gravac.adapt import build_controller
from ds_gravac.adapt.base import AgreedStats, ControllerContext, StepDecision
from ds_gravac.adapt.gravac import GravacController
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError

N, B = 4, 32          # world size, samples per worker per step → T_sys = 128 / t_iter
from gravac_cases import N, Sim, drifting_tc, log_gain, log_tsys, make_config, make_ctrl, make_ctx


# ---- gain estimators (R1, R5) ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind, expected_gain, expected_branch",
                         [("ratio_of_ewmas", 0.475 / 0.55, "cand"), ("ewma_of_ratio", 0.7, "dense")])
def test_ratio_of_ewmas_vs_ewma_of_ratio(kind, expected_gain, expected_branch):
    gain = lambda t, i: 0.6 if t == 10.0 else (0.9 if i == 0 else 0.5)
    den = lambda i: 1.0 if i == 0 else 0.1
    sim = Sim(make_ctrl(gain_ewma=kind, epsilon=0.75), gain, log_tsys, den=den).run(3)
    # after steps 0 (num 0.9, den 1) and 1 (num 0.05, den 0.1), α = 0.5:
    #   ratio of EWMAs (0.5·0.05 + 0.5·0.9) / (0.5·0.1 + 0.5·1) = 0.8636;  EWMA of ratios 0.5·0.5 + 0.5·0.9 = 0.7
    assert sim.ctrl.telemetry()["gravac/gain_cand"] == pytest.approx(expected_gain, rel=1e-12)
    assert sim.ctrl.telemetry()["gravac/gain_cand_raw"] == pytest.approx(0.5)
    assert sim.decisions[2].branch == expected_branch


def test_raw_denominator_allows_gain_above_one():
    ctrl = make_ctrl(gain_denominator="raw")
    d0 = ctrl.decide(0, 0.1, True)
    ctrl.observe(AgreedStats(0, d0, den=1.0, den_raw=0.5, nums=(0.6, 0.55), t_iter_prev=0.0, t_gain_prev=0.0,
                             values_sent=0.0, bytes_sent=0.0, nonfinite=0.0, world_size=N))
    assert ctrl.telemetry()["gravac/gain_min"] == pytest.approx(1.2)
    assert ctrl.telemetry()["gravac/gain_cand"] == pytest.approx(1.1)


def test_nonfinite_stats_do_not_touch_records():
    ctrl = make_ctrl()
    d0 = ctrl.decide(0, 0.1, True)
    ctrl.observe(AgreedStats(0, d0, den=float("nan"), den_raw=1.0, nums=(0.5, 0.4), t_iter_prev=0.0,
                             t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=3.0, world_size=N))
    assert ctrl.gains == {}
    assert ctrl.decide(1, 0.1).branch == "dense"                       # no record passes ε (R8)


# ---- timings (docs/algorithms.md, R7) ------------------------------------------------------------------------

def test_throughput_attribution_and_dense_gain_time_subtracted():
    ctrl = make_ctrl()
    mk = lambda i, d, t, tg: AgreedStats(i, d, den=1.0, den_raw=1.0, nums=tuple(0.9 for _ in d.probe_levels),
                                         t_iter_prev=t, t_gain_prev=tg, values_sent=0.0, bytes_sent=0.0,
                                         nonfinite=0.0, world_size=N)
    d0 = ctrl.decide(0, 0.1, True)
    ctrl.observe(mk(0, d0, 0.0, 0.0))                                  # t_iter(−1) unknown
    d1 = ctrl.decide(1, 0.1)
    assert (d1.branch, d1.send_level) == ("cand", 20.0)
    ctrl.observe(mk(1, d1, 0.9, 0.1))                                  # step 0 dense: 128 / (0.9 − 0.1) = 160
    assert ctrl.thru[1.0].t_sys == pytest.approx(160.0)
    d2 = ctrl.decide(2, 0.1)
    ctrl.observe(mk(2, d2, 0.5, 0.1))                                  # step 1 sent 20: 128 / 0.5 = 256
    d3 = ctrl.decide(3, 0.1)
    ctrl.observe(mk(3, d3, 0.25, 0.1))                                 # 128 / 0.25 = 512 → EWMA 384
    tel = ctrl.telemetry()
    assert ctrl.thru[20.0].t_sys == pytest.approx(384.0) and ctrl.thru[20.0].sent_count == 2
    assert tel["gravac/t_iter"] == 0.25 and tel["gravac/t_sys"] == pytest.approx(512.0)
    assert tel["gravac/t_compression"]["20"] == pytest.approx(384.0 * 0.9)
    assert tel["gravac/t_compression"]["1"] == pytest.approx(160.0)


def test_forced_dense_mid_run_keeps_phase_and_windows():
    sim = Sim(make_ctrl(), log_gain, log_tsys, force=lambda i: i in (0, 30)).run(45)
    d30 = sim.decisions[30]
    assert d30.branch == "dense" and d30.forced_dense and d30.probe_levels == (10.0, 40.0)
    assert sim.trace[30] == sim.trace[29] == (10.0, 40.0, "SEARCH")
    assert sim.trace[41] == (10.0, 160.0, "SEARCH")                    # boundary still at i0 + 2·window
    assert sim.ctrl.gains[40.0].last_step >= 30
    assert sim.decisions[31].branch == "cand"


def test_warmup_steps_are_dense_and_measured():
    sim = Sim(make_ctrl(warmup_steps=3), log_gain, log_tsys).run(8)
    assert [d.branch for d in sim.decisions[:4]] == ["dense"] * 4
    assert [t[2] for t in sim.trace[:5]] == ["WARMUP"] * 4 + ["SEARCH"]
    assert sim.decisions[4].branch == "cand" and sim.ctrl.gains[20.0].count >= 4
    assert sim.ctrl.thru[1.0].sent_count >= 3


# ---- checkpoint round trip -------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["wavy", "settle"])
@pytest.mark.parametrize("decision", ["pipelined", "strict"])
def test_state_dict_json_round_trip_gives_identical_future(decision, scenario):
    kw = dict(theta_max=2000, scaling_policy="geometric", decision=decision, settled_policy="recheck")
    gain, tsys = (wavy_gain_geo, log_tsys) if scenario == "wavy" else (log_gain, drifting_tc(181))
    total = 1 + 11 * 20
    ref = Sim(make_ctrl(**kw), gain, tsys).run(total)
    for cut in (1, 17, 20, 21, 58, 161, 170, 201):
        sim = Sim(make_ctrl(**kw), gain, tsys).run(cut)
        state = json.loads(json.dumps(sim.ctrl.state_dict()))
        fresh = GravacController(make_config(**kw))
        fresh.bind(make_ctx())
        fresh.load_state_dict(state)
        assert fresh.state_dict() == sim.ctrl.state_dict()
        sim.ctrl = fresh
        sim.run(total - cut)
        assert sim.decisions == ref.decisions, cut
        assert sim.trace == ref.trace
        assert sim.ctrl.state_dict() == ref.ctrl.state_dict()
        assert sim.ctrl.state_checksum() == ref.ctrl.state_checksum()
    if scenario == "settle":
        assert [ref.trace[i][2] for i in (160, 161, 201)] == ["SEARCH", "SETTLED", "SEARCH"]
    else:
        assert {d.branch for d in ref.decisions[1:]} == {"dense", "min", "cand"}


def wavy_gain_geo(theta: float, i: int) -> float:
    return log_gain(theta) - 0.15 + 0.15 * math.sin(0.5 * i + theta)


def test_load_before_bind_keeps_loaded_state():
    sim = Sim(make_ctrl(), log_gain, log_tsys).run(30)
    state = json.loads(json.dumps(sim.ctrl.state_dict()))
    fresh = GravacController(make_config())
    fresh.load_state_dict(state)
    fresh.bind(make_ctx())
    assert fresh.state_dict() == sim.ctrl.state_dict()


# ---- attach checks and defaults --------------------------------------------------------------------------

def test_bind_rejects_gainless_compressor_with_clear_message():
    ctrl = GravacController(make_config(compressor="signsgd"))
    with pytest.raises(GravacConfigError, match=r"^ds_gravac: mode 'gravac' needs a compressor with gain_kind "
                                                r"'projection' and >= 2 realizable CFs; 'signsgd' is static-only"):
        ctrl.bind(make_ctx(grid=[32.0], gain_kind="none"))


@pytest.mark.parametrize("ctx", [make_ctx(level_kind="rank"), make_ctx(grid=[16.0, 16.0])])
def test_bind_rejects_rank_levels_and_single_cf_grids(ctx):
    with pytest.raises(GravacConfigError, match="needs a compressor"):
        GravacController(make_config()).bind(ctx)


@pytest.mark.parametrize("rescale, phrase", [(False, "1/theta"), (True, "throughput alone")])
def test_randomk_warns_which_regime_applies(caplog, rescale, phrase):
    with caplog.at_level(logging.WARNING, logger="ds_gravac"):
        make_ctrl(compressor={"type": "randomk", "params": {"rescale": rescale}}, theta_min=1.5)
    assert "Random-k" in caplog.text and phrase in caplog.text


@pytest.mark.parametrize("world, alpha", [(1, 0.01), (4, 0.04), (32, 0.32), (64, 0.5)])
def test_default_alpha_is_clamped_n_over_100(world, alpha):
    ctrl = GravacController(make_config(ewma_alpha=None))
    ctrl.bind(make_ctx(world_size=world))
    assert ctrl.alpha == pytest.approx(alpha)


def test_build_controller_and_telemetry_keys():
    ctrl = build_controller(make_config())
    assert isinstance(ctrl, GravacController)
    ctrl.bind(make_ctx())
    Sim(ctrl, log_gain, log_tsys).run(5)
    tel = ctrl.telemetry()
    for key in ("branch", "cf_sent", "theta_min", "theta_c", "step_size", "phase", "gain_min", "gain_cand",
                "gain_min_raw", "gain_cand_raw", "t_iter", "t_sys", "t_compression"):
        assert f"gravac/{key}" in tel
    assert (tel["gravac/branch"], tel["gravac/cf_sent"], tel["gravac/step_size"]) == (2, 20.0, 2.0)
    assert json.loads(json.dumps(tel, allow_nan=True))


def _bound_ctx() -> ControllerContext:
    return ControllerContext(world_size=2, samples_per_step=8, realize_cf=float, cf_grid=None, multilevel="exact",
                             gain_kind="projection", level_kind="cf", compressible=("a",))


def test_every_controller_field_restores() -> None:
    a = GravacController(parse_config({"mode": "gravac", "warmup_steps": 3, "window": 4, "refresh_steps": 1,
                                       "min_sent_steps": 1}))
    a.bind(_bound_ctx())
    for step in range(12):
        d = a.decide(step, 0.1)
        a.observe(AgreedStats(step=step, decision=d, den=1.0, den_raw=1.0, nums=(0.9,) * len(d.probe_levels),
                              t_iter_prev=0.5, t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=0.0,
                              world_size=2))
    state = a.state_dict()
    b = GravacController(parse_config({"mode": "gravac", "window": 4, "refresh_steps": 1, "min_sent_steps": 1}))
    b.bind(_bound_ctx())
    b.load_state_dict(state)
    assert b.state_dict() == state and b.i0 == 4
    assert isinstance(b.decide(12, 0.1), StepDecision)


def test_controller_events_are_bounded_without_pop() -> None:
    """Events accumulate only up to EVENTS_KEPT when nobody pops them (a long run must not grow memory)."""
    from ds_gravac.adapt.base import EVENTS_KEPT, Controller
    ctrl = Controller(parse_config({"mode": "static"}))
    for step in range(EVENTS_KEPT + 500):
        ctrl.log_event(step, "boundary")
    events = ctrl.pop_events()
    assert len(events) == EVENTS_KEPT and events[-1]["step"] == EVENTS_KEPT + 499
    assert ctrl.pop_events() == []
