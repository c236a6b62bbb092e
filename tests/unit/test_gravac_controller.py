"""GraVAC controller (docs/algorithms.md): scripted gain/time streams fed through the synchronizer's protocol.

Expected values are derived from docs/algorithms.md (candidate lists, the paper's 1280x/2000x example, R1–R8),
not from the implementation's output.
"""
from __future__ import annotations

import json
import logging
import math
from typing import Callable, Optional

import pytest

from ds_gravac.adapt import build_controller
from ds_gravac.adapt.base import MAX_PROBES, AgreedStats, ControllerContext, StepDecision
from ds_gravac.adapt.gravac import GravacController
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError

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


# ---- candidate sequences (docs/algorithms.md) ----------------------------------------------------------------

def test_exponential_sequence_10_20_40_160_1000():
    sim = Sim(make_ctrl(), log_gain, log_tsys).run(1 + 5 * 20 + 5)
    expected = [20.0, 40.0, 160.0, 1000.0, 1000.0]
    for k, theta in enumerate(expected, start=1):
        assert sim.sent_levels(window_range(k).start, window_range(k).stop) == {theta}, k
        assert all(sim.decisions[i].branch == "cand" for i in window_range(k))
    assert sim.decisions[0].branch == "dense" and sim.decisions[0].forced_dense
    assert {t[0] for t in sim.trace} == {10.0}                       # θ_min never escalates here
    assert sim.trace[-1][2] == "EXHAUSTED"
    changes = [e["theta_c"] for e in sim.ctrl.pop_events() if e["event"] == "cf_change"]
    assert changes == [40.0, 160.0, 1000.0]


def test_geometric_sequence_to_2000():
    sim = Sim(make_ctrl(theta_max=2000, scaling_policy="geometric"), log_gain, log_tsys).run(1 + 9 * 20)
    expected = [20, 40, 80, 160, 320, 640, 1280, 2000, 2000]
    got = [sim.sent_levels(window_range(k).start, window_range(k).stop) for k in range(1, 10)]
    assert got == [{float(t)} for t in expected]
    assert sim.ctrl.phase == "EXHAUSTED"


def test_candidates_snap_to_grid_and_unbiased_warns(caplog):
    grid = [2.0, 4.0, 8.0, 16.0, 32.0]
    with caplog.at_level(logging.WARNING, logger="ds_gravac"):
        ctrl = make_ctrl(make_ctx(grid=grid, gain_kind="unbiased"), theta_min=2, compressor="qsgd")
    assert "unbiased" in caplog.text
    sim = Sim(ctrl, lambda t, i: 1.0, log_tsys).run(1 + 4 * 20)
    # exponential factors 2, 4, 16, 256 → raw 4, 8, 32, 512 → snapped 4, 8, 32; nothing above 32 → EXHAUSTED
    got = [sim.sent_levels(window_range(k).start, window_range(k).stop) for k in range(1, 5)]
    assert got == [{4.0}, {8.0}, {32.0}, {32.0}]
    assert ctrl.phase == "EXHAUSTED"


# ---- window boundary: escalation, saturation (docs/algorithms.md, R2, R3) -------------------------------------

def test_theta_min_escalates_to_evaluated_candidate_within_omega():
    gains = {10.0: 0.95, 20.0: 0.948, 40.0: 0.90, 160.0: 0.85, 1000.0: 0.8}
    sim = Sim(make_ctrl(), lambda t, i: gains[t], log_tsys).run(1 + 3 * 20)
    # boundary 21: |0.95 − 0.948| / 0.95 = 0.2% ≤ 1% → θ_min = 20; candidates stay absolute (40, not 80)
    assert sim.trace[20] == (10.0, 20.0, "SEARCH")
    assert sim.trace[21] == (20.0, 40.0, "SEARCH")
    # boundary 41: |0.948 − 0.90| / 0.948 = 5% > 1% → θ_min stays 20
    assert sim.trace[41] == (20.0, 160.0, "SEARCH")
    assert sim.decisions[21].probe_levels[:2] == (20.0, 40.0)          # slot 0 = θ_min, slot 1 = θ_c


def settle_tc(tc: dict[float, float]) -> Callable[[float, int], float]:
    """T_sys making T_c(θ) = T̄_sys·δ(θ) equal the scripted values."""
    return lambda t, i: 50.0 if t <= 1 else tc[t] / log_gain(t)


PAPER_TC = {10.0: 250.0, 20.0: 300.0, 40.0: 400.0, 80.0: 500.0, 160.0: 600.0, 320.0: 700.0, 640.0: 800.0,
            1280.0: 1029.9, 2000.0: 1035.4}


def test_saturation_paper_example_settles_at_1280_and_freezes():
    ctrl = make_ctrl(theta_max=2000, scaling_policy="geometric")
    sim = Sim(ctrl, log_gain, settle_tc(PAPER_TC)).run(1 + 11 * 20)
    # (1035.4 − 1029.9) / 1029.9 = 0.53% ≤ ω → lower CF of the two = 1280, from the boundary at 161 on
    assert sim.trace[160][1] == 2000.0 and sim.trace[160][2] == "SEARCH"
    assert sim.trace[161] == (10.0, 1280.0, "SETTLED")
    assert sim.sent_levels(161, 221) == {1280.0}                       # freeze: no more scale-up
    settled = [e for e in ctrl.pop_events() if e["event"] == "settled"]
    assert len(settled) == 1 and settled[0]["theta_ideal"] == 1280.0


def test_saturation_takes_lower_cf_not_second_largest():
    tc = {**PAPER_TC, 640.0: 1000.0, 1280.0: 995.0}
    sim = Sim(make_ctrl(theta_max=2000, scaling_policy="geometric"), log_gain, settle_tc(tc)).run(1 + 8 * 20)
    # boundary 141 ends 1280's window: top two 640 (1000) ≥ 1280 (995), 0.5% apart → θ_ideal = min = 640
    assert sim.trace[140] == (10.0, 1280.0, "SEARCH")
    assert sim.trace[141] == (10.0, 640.0, "SETTLED")
    assert sim.sent_levels(141, 161) == {640.0}


def test_settling_on_dense_lowers_theta_min_to_one():
    tc = {1.0: 1000.0, 20.0: 995.0}
    tsys = lambda t, i: tc[1.0] if t <= 1 else tc[t] / log_gain(t)
    sim = Sim(make_ctrl(warmup_steps=5), log_gain, tsys).run(6 + 20 + 10)
    i0 = 6
    assert all(d.branch == "dense" for d in sim.decisions[:i0])
    assert sim.sent_levels(i0, i0 + 20) == {20.0}
    assert sim.trace[i0 + 20] == (1.0, 1.0, "SETTLED")                  # θ_ideal = 1 → train dense
    assert all(d.branch == "dense" and d.probe_levels == () for d in sim.decisions[i0 + 20:])


def drifting_tc(step_change: int) -> Callable[[float, int], float]:
    """Paper table; from ``step_change`` on, 1280x gets 20% slower (T_c 1029.9 → ~824)."""
    base = settle_tc(PAPER_TC)
    return lambda t, i: base(t, i) * (0.8 if t == 1280.0 and i >= step_change else 1.0)


def test_settled_recheck_resumes_search_when_test_fails():
    ctrl = make_ctrl(theta_max=2000, scaling_policy="geometric", settled_policy="recheck")
    sim = Sim(ctrl, log_gain, drifting_tc(181)).run(1 + 12 * 20)
    assert sim.trace[161] == (10.0, 1280.0, "SETTLED")
    assert sim.trace[181] == (10.0, 1280.0, "SETTLED")                 # test still passes at 181
    # at 201 T̄_sys(1280) has drifted: 2000 (1035.4) vs 640 (800) → not saturated → SEARCH, advance past 1280
    assert sim.trace[201] == (10.0, 2000.0, "SEARCH")
    assert any(e["event"] == "recheck_failed" for e in ctrl.pop_events())


def test_settled_freeze_ignores_drift():
    ctrl = make_ctrl(theta_max=2000, scaling_policy="geometric")
    sim = Sim(ctrl, log_gain, drifting_tc(181)).run(1 + 12 * 20)
    assert sim.trace[-1] == (10.0, 1280.0, "SETTLED")
    assert sim.sent_levels(161, 241) == {1280.0}


# ---- per-step ε test (docs/algorithms.md, R8) ---------------------------------------------------------

def test_dense_when_both_gains_below_epsilon():
    sim = Sim(make_ctrl(), lambda t, i: 0.5, log_tsys).run(45)
    assert all(d.branch == "dense" and d.send_level == 1.0 for d in sim.decisions)
    assert all(d.probe_levels[:2] == (sim.trace[i][0], sim.trace[i][1]) for i, d in enumerate(sim.decisions))


def test_min_branch_when_only_theta_min_passes():
    gains = {10.0: 0.8, 20.0: 0.6, 40.0: 0.5}
    sim = Sim(make_ctrl(), lambda t, i: gains[t], log_tsys).run(21)
    assert all(d.branch == "min" and d.send_level == 10.0 for d in sim.decisions[1:])


@pytest.mark.parametrize("policy, decision, expect_cand_at_boundary",
                         [("keep", "pipelined", False), ("refresh", "pipelined", True), ("keep", "strict", True)])
def test_candidate_without_record_is_not_eligible(policy, decision, expect_cand_at_boundary):
    sim = Sim(make_ctrl(stale_policy=policy, decision=decision), log_gain, log_tsys).run(23)
    d21 = sim.decisions[21]                                            # first step with θ_c = 40
    assert sim.trace[21][1] == 40.0
    if expect_cand_at_boundary:
        assert (d21.branch, d21.send_level) == ("cand", 40.0)
    else:                                                              # no sample of 40 yet → θ_min alone
        assert (d21.branch, d21.send_level) == ("min", 10.0)
    assert (sim.decisions[22].branch, sim.decisions[22].send_level) == ("cand", 40.0)


def test_refresh_probes_next_candidate_and_recent_table_cfs():
    sim = Sim(make_ctrl(theta_max=2000, scaling_policy="geometric"), log_gain, log_tsys).run(1 + 3 * 20)
    inside, refresh = sim.decisions[50], sim.decisions[57]             # window 3 = [41, 61), θ_c = 80
    assert inside.probe_levels == (10.0, 80.0)
    assert refresh.probe_levels[:3] == (10.0, 80.0, 160.0)             # θ_min, θ_c, next candidate
    assert set(refresh.probe_levels[3:]) == {20.0, 40.0}
    assert refresh.probe_levels[3] == 40.0                             # most recently sent first
    keep = Sim(make_ctrl(stale_policy="keep"), log_gain, log_tsys).run(41)
    assert all(len(d.probe_levels) == 2 for d in keep.decisions)


# ---- strict vs pipelined (docs/algorithms.md) ------------------------------------------------------------------

def wavy_gain(theta: float, i: int) -> float:
    base = {10.0: 0.8, 20.0: 0.72, 40.0: 0.66, 160.0: 0.62, 1000.0: 0.6}[theta]
    return base + 0.15 * math.sin(0.7 * i + math.log(theta))


@pytest.mark.parametrize("policy", ["keep", "refresh"])
def test_pipelined_lags_strict_by_one_step_except_after_boundaries(policy):
    steps = 1 + 5 * 20
    linear = lambda t, i: 50.0 if t <= 1 else 100.0 * t               # T_c ratios ≥ 1.17: never saturates
    pipe = Sim(make_ctrl(stale_policy=policy), wavy_gain, linear).run(steps)
    strict = Sim(make_ctrl(stale_policy=policy, decision="strict"), wavy_gain, linear).run(steps)
    assert [t for t in pipe.trace] == [t for t in strict.trace]        # same boundaries, same θ's
    boundaries = {1 + k * 20 for k in range(1, 6)}
    compared = 0
    for i in range(1, steps - 1):
        if i + 1 in boundaries:
            continue
        p, s = pipe.decisions[i + 1], strict.decisions[i]
        assert (p.branch, p.send_level) == (s.branch, s.send_level), i
        compared += 1
    assert compared > 90
    assert {d.branch for d in strict.decisions[1:]} == {"dense", "min", "cand"}
    if policy == "keep":                                               # new candidate: no sample in pipelined
        fresh = [b for b in boundaries if b < steps and pipe.trace[b][1] != pipe.trace[b - 1][1]]
        assert len(fresh) == 3 and all(pipe.decisions[b].branch != "cand" for b in fresh)


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
