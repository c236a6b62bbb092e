"""GraVAC controller (docs/algorithms.md): candidate sequences, the window boundary, the per-step ε test and
pipelined decisions, from scripted gain/time streams fed through the synchronizer's protocol (estimators, timings,
checkpoints and attach checks: test_gravac_controller_state).

Expected values are derived from docs/algorithms.md (candidate lists, the paper's 1280x/2000x example, R1–R8),
not from the implementation's output.
"""
from __future__ import annotations

import logging

import pytest


N, B = 4, 32          # world size, samples per worker per step → T_sys = 128 / t_iter
from gravac_cases import (PAPER_TC, Sim, drifting_tc, log_gain, log_tsys, make_ctrl, make_ctx, settle_tc, wavy_gain,
                          window_range)


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
