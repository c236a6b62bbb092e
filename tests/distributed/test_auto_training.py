"""``mode: "auto"`` over PowerSGD on real gloo ranks and DeepSpeed engines: both ranks apply rank 0's codes every
step, the plan moves from the tight start (dense) to a compressed plan, a learning-rate drop tightens the next
decision, and a checkpoint resume restores the plan bitwise and continues exactly as the uninterrupted run.

One spawn of two ranks runs everything: an uninterrupted run of ``STEPS`` steps with the learning rate divided by
10 before step ``DROP``, and the same run saved after ``SAVE`` steps and resumed in a fresh engine.
"""
from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import models as M
from harness import run_ranks

# a nominal 10 Mbit/s link, so that compressing the 128 × 128 layers pays on this tiny model (and the plans do not
# depend on this machine's timing: the resumed run must repeat the uninterrupted one); the norm-change phase off,
# so the tight decisions are the start's and the lr drop's (this tiny model's norms move by > 50% in 4 steps);
# dense steps in fp32 ("engine"), so that their signals equal a float64 reference of the gradients (the bf16
# default is tested in test_auto_dense_dtype.py); exact ranks off: 16 samples a step leave the 128 × 128 layers'
# gradients at rank ≤ 16 with a steep spectrum, under 1% unsent from rank 8 up, so the tight start would send them
# there instead of dense (exact ranks: test_auto_exact_rank.py)
AUTO = {"mode": "auto", "compressor": "powersgd", "bucket_cap_mb": 0.05, "min_compress_numel": 0,
        "agreement_check_interval": 1,
        "auto": {"warmup_steps": 0, "interval_steps": 4,
                 "dwell": 1, "pin_below_numel": 0, "link": "nominal", "link_gbit_s": 0.01,
                 "detector_eta": None, "dense_dtype": "engine", "exact_fraction": 0.0}}
# the link timed at attach, and again at the second decision (step 4); probes up to 16 MB, so that the per-byte
# slope stands above the latency noise of a loaded 2-core machine (CI measured a 5 ms median at every size up to
# the default 2 MB, a flat fit with no slope, while the other pytest worker ran)
PROBES = {"probe_bytes": [65536, 4194304, 16777216], "probe_repeats": 5}
MEASURED = {**AUTO, "cost_model": PROBES,
            "auto": {"warmup_steps": 0, "interval_steps": 2, "pin_below_numel": 0, "remeasure_decisions": 1}}
# the link timed at attach only, and re-timed whenever a step is off its prediction (any difference, here)
REFIT = {**AUTO, "cost_model": PROBES, "auto": {"warmup_steps": 0, "interval_steps": 2,
                                                "pin_below_numel": 0, "remeasure_decisions": 0,
                          "refit_tolerance": 1e-9}}
STEPS, DROP, SAVE = 20, 12, 9
DECISIONS = (2, 6, 10, 14, 18)        # start 2 (the first signals), then every 4 steps


def _engine(world: int, section: dict = AUTO) -> Any:
    import ds_gravac
    model = M.make_model(seed=0, width=128)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(section, world=world))
    return engine


def _train(engine: Any, rank: int, start: int, stop: int) -> None:
    """Steps [start, stop); the learning rate drops 10x before step DROP (a scheduler step on every rank)."""
    for s in range(start, stop):
        if s == DROP:
            for group in engine.optimizer.param_groups:
                group["lr"] *= 0.1
        M.train(engine, rank, 1, start=s)


def _records(engine: Any) -> list[dict]:
    import ds_gravac
    keep = ("step", "branch", "bytes_sent", "nonfinite")
    return [{k: v for k, v in r.items() if k in keep or k.startswith("auto/")}
            for r in ds_gravac.get_handle(engine).pop_stats()]


PROBE = 3          # a dense step (the tight start): its agreed per-group energy is exactly ‖ḡ_g‖²


def _watch(engine: Any, rank_grads: dict, signals: dict) -> None:
    """Keep this rank's local gradients of step PROBE, and every agreed per-group signal the controller observes."""
    import ds_gravac
    for name, p in engine.module.named_parameters():
        p.register_hook(lambda g, name=name: rank_grads.__setitem__(name, g.detach().double().clone())
                        if engine.global_steps == PROBE else None)
    ctl = ds_gravac.get_handle(engine).controller
    observe = ctl.observe

    def watched(stats: Any) -> None:
        if stats.aggregate is not None:
            signals[stats.aggregate.step] = [(s.den, s.applied, s.prefix) for s in stats.aggregate.groups]
        observe(stats)
    ctl.observe = watched


SCRIPTED = {**AUTO, "auto": {**AUTO["auto"], "interval_steps": 2}}
SCRIPT = {2: 2, 4: 8, 6: 8}  # the 128 × 128 groups' rank decided at steps 2 and 4 (a raise); the rest held


def _scripted(rank: int, world: int) -> dict:
    """Rank 0's proposals replaced by a script (everything after the broadcast is the controller's own): the
    128 × 128 groups at rank 2, then raised to rank 8 — re-projected (plain) at step 4, rank 8 from step 5; every
    other group at its lowest rung throughout."""
    import ds_gravac
    engine = _engine(world, SCRIPTED)
    ctl = ds_gravac.get_handle(engine).controller
    signals: dict = {}
    _watch(engine, {}, signals)

    def propose(step: int, lr: float) -> torch.Tensor:
        codes = [next(i for i, lv in enumerate(g.ladder) if lv.family == "lowrank" and lv.value == SCRIPT[step])
                 if g.name == "128x128" else len(g.ladder) - 1 for g in ctl.groups]     # others: lowest rung
        return torch.tensor(codes + [0], dtype=torch.int64)
    ctl.propose = propose
    reprojected = {}
    accept = ctl.accept

    def watched_accept(step: int, proposal: torch.Tensor) -> set:
        out = accept(step, proposal)
        reprojected[step] = [ctl.groups[g].name for g in ctl.reproject]
        return out
    ctl.accept = watched_accept
    M.train(engine, rank, 7)
    ladder = next([int(lv.value) for lv in g.ladder if lv.family == "lowrank"] for g in ctl.groups
                  if g.name == "128x128")
    index = next(i for i, g in enumerate(ctl.groups) if g.name == "128x128")
    return {"records": _records(engine), "signals": {s: v[index] for s, v in signals.items()},
            "reprojected": reprojected, "ladder": ladder, "params": M.params_of(engine)}


SLOW = 100.0      # rank 1 sees its all-reduce probes this many times slower than they ran


def _one_slow_rank(rank: int, world: int) -> dict:
    """``auto.link: "measure"`` with rank 1's probe timings scaled by SLOW (a rank behind a slower link): every
    rank must price from the same agreed fits and apply the same codes."""
    import ds_gravac
    from ds_gravac.sync.cost_model import calibrate
    taken: dict = {}
    original = calibrate.collective_samples

    def samples(*args: Any, **kwargs: Any) -> dict:
        out = original(*args, **kwargs)
        if rank == 1:
            out = {k: [(c, x, t * SLOW) for c, x, t in v] for k, v in out.items()}
        taken.setdefault("samples", out)
        return out
    calibrate.collective_samples = samples
    try:
        engine = _engine(world, MEASURED)
        M.train(engine, rank, 5)
    finally:
        calibrate.collective_samples = original
    ctl = ds_gravac.get_handle(engine).controller
    fits = ctl.ctx.cost_fits()
    return {"samples": taken["samples"], "fits": {k: (fits.get(k).a, fits.get(k).b) for k in fits.names()},
            "records": _records(engine), "params": M.params_of(engine)}


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    straight = _engine(world)
    grads: dict = {}
    signals: dict = {}
    _watch(straight, grads, signals)
    _train(straight, rank, 0, STEPS)
    members = {g.name: (list(g.members), [int(lv.value) for lv in g.ladder if lv.family == "lowrank"])
               for g in ds_gravac.get_handle(straight).controller.groups}
    first = _engine(world)
    _train(first, rank, 0, SAVE)
    handle = ds_gravac.get_handle(first)
    saved_state = handle.controller.state_dict()
    handle.save_checkpoint(save_dir, tag="auto")
    resumed = _engine(world)
    ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="auto")
    loaded_state = ds_gravac.get_handle(resumed).controller.state_dict()
    _train(resumed, rank, SAVE, STEPS)
    measured = _engine(world, MEASURED)
    M.train(measured, rank, 5)
    ctl = ds_gravac.get_handle(measured).controller
    fits = ctl.ctx.cost_fits()
    before_poison, records, params = ctl.state_dict(), _records(measured), M.params_of(measured)
    events = [e for e in ds_gravac.get_handle(measured).pop_events() if e["event"] == "auto_link_measured"]
    remeasured = {k: (ctl._pricer().link[k].a, ctl._pricer().link[k].b) for k in ("all_reduce",)}
    # step 5 (no decision point): rank 1's gradient of one tensor is NaN; nothing of the step may reach the state
    measured.module.hidden[0].weight.register_hook(
        lambda g: g.clone().fill_(float("nan")) if rank == 1 and measured.global_steps == 5 else g)
    M.train(measured, rank, 1, start=5)
    refit = _engine(world, REFIT)
    # every step 50 ms slower than the last on both ranks: each 2-step interval measures 0.1 s over its prediction
    refit.module.register_forward_pre_hook(lambda *_: time.sleep(0.05 * refit.global_steps))
    M.train(refit, rank, 13)
    refit_events = [e for e in ds_gravac.get_handle(refit).pop_events() if e["event"] == "auto_link_measured"]
    return {"measured_fits": {k: (fits.get(k).a, fits.get(k).b) for k in fits.names()},
            "measured_records": records, "measured_params": params, "before_poison": before_poison,
            "link_events": events, "remeasured": remeasured,
            "after_poison": ctl.state_dict(), "poisoned_record": _records(measured)[-1],
            "params": M.params_of(straight), "records": _records(straight),
            "resumed_params": M.params_of(resumed), "resumed_records": _records(resumed),
            "saved_state": saved_state, "loaded_state": loaded_state, "members": members, "grads": grads,
            "signals": signals, "refit_events": refit_events, "refit_records": _records(refit),
            "refit_params": M.params_of(refit), "scripted": _scripted(rank, world),
            "one_slow": _one_slow_rank(rank, world)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(_job, 2, str(tmp_path_factory.mktemp("auto_ckpt")))


TIMED = ("auto/measured_step_s", "auto/predicted_step_s")     # this machine's step times: differ between two runs


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMED}


def _by_step(records: list[dict]) -> dict[int, dict]:
    return {int(r["step"]): r for r in records}


def test_ranks_apply_the_same_codes_and_params(results: list[dict]) -> None:
    r0, r1 = results
    assert len(r0["records"]) == STEPS
    assert r0["records"] == r1["records"]         # codes, phase, predictions, bytes: every step, both ranks
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name


def test_group_signals_of_a_dense_step_are_the_mean_gradients_energy(results: list[dict]) -> None:
    """Independent float64 reference: ‖mean over ranks of g_w‖² per group, from each rank's local gradients."""
    r0, r1 = results
    assert r0["signals"] == r1["signals"]           # agreed: bitwise the same on both ranks
    assert set(r0["signals"]) == set(range(STEPS - 1))      # step i's signals arrive with step i + 1
    from ds_gravac.adapt.auto.ladder import RANKS
    for g, (name, (members, ladder)) in enumerate(r0["members"].items()):
        # a parameter without a gradient ("unused") is averaged as zeros
        mean_sq = sum(float(((r0["grads"][m] + r1["grads"][m]) / 2).square().sum()) for m in members
                      if m in r0["grads"])
        den, applied, prefix = r0["signals"][PROBE][g]
        assert den == pytest.approx(mean_sq, rel=1e-5), name
        assert applied == pytest.approx(mean_sq, rel=1e-5), name
        known = [p for p in prefix if p is not None]
        # a dense step measures every rank up to the factors' width: every rank of the group's ladder
        assert all(prefix[RANKS.index(r)] is not None for r in ladder), name
        assert all(0.0 <= p <= den * (1 + 1e-6) for p in known), name
        assert known == sorted(known, reverse=True), name       # RANKS are listed from 64 down: prefixes shrink


def test_tight_start_then_a_compressed_plan(results: list[dict]) -> None:
    recs = _by_step(results[0]["records"])
    hidden = "auto/level/128x128"
    assert hidden in recs[2]
    # the tight start (β 0.25 of rank 16's unsent energy) keeps the hidden layers dense ...
    assert recs[2]["auto/tight"] == 1 and recs[2][hidden] == 0.0 and recs[2]["branch"] == "dense"
    # ... the first quiet decision compresses them, and the step's bytes fall with it
    assert recs[6]["auto/tight"] == 0 and recs[6][hidden] > 0 and recs[6]["branch"] == "cand"
    assert recs[6]["bytes_sent"] < recs[2]["bytes_sent"]
    assert recs[6]["auto/error"] <= recs[6]["auto/budget"]
    for s in range(STEPS):          # codes change only at decision points
        if s not in DECISIONS and s > 0:
            assert ({k: v for k, v in recs[s].items() if k.startswith("auto/level/")} ==
                {k: v for k, v in recs[s - 1].items() if k.startswith("auto/level/")}), s


def test_lr_drop_tightens_the_next_decision(results: list[dict]) -> None:
    recs = _by_step(results[0]["records"])
    before, after = recs[10], recs[14]          # the last decision before the drop (step 12), the first after
    assert before["auto/tight"] == 0 and after["auto/tight"] == 1
    # "denser" by error: the plan's predicted unsent energy relative to rank 16 everywhere, same signals' units
    assert after["auto/error_ratio"] <= before["auto/error_ratio"]
    assert after["auto/error"] <= after["auto/budget"]
    assert after["auto/budget"] == 0.25 * after["auto/reference_error"] > 0       # β tight, of rank 16's error
    assert before["auto/budget"] == before["auto/reference_error"] > 0             # β quiet
    assert recs[18]["auto/tight"] == 0          # quiet again one interval later


def test_measured_link_is_agreed(results: list[dict]) -> None:
    """``auto.link: "measure"``: both ranks price from the same fits (MAX over ranks), and decide alike."""
    r0, r1 = results
    assert r0["measured_fits"] == r1["measured_fits"]
    assert set(r0["measured_fits"]) == {"all_reduce", "gemm"}
    assert all(v >= 0.0 for fit in r0["measured_fits"].values() for v in fit)
    assert r0["measured_fits"]["all_reduce"][1] > 0 and r0["measured_fits"]["gemm"][1] > 0
    assert r0["measured_records"] == r1["measured_records"]
    # re-timed at the second decision only, on both ranks alike; the plan prices the new fit
    assert [e["step"] for e in r0["link_events"]] == [4] and r0["link_events"] == r1["link_events"]
    new = (r0["link_events"][0]["all_reduce_a"], r0["link_events"][0]["all_reduce_b"])
    assert r0["remeasured"]["all_reduce"] == new == r1["remeasured"]["all_reduce"]
    assert [r["auto/decisions"] for r in r0["measured_records"]] == [0, 0, 1, 1, 2]
    assert r0["measured_records"][2]["auto/reference_exchange_s"] > 0
    for name, value in r0["measured_params"].items():
        assert torch.equal(value, r1["measured_params"][name]), name


def test_a_nonfinite_step_leaves_the_controller_untouched(results: list[dict]) -> None:
    for res in results:
        assert res["poisoned_record"]["step"] == 5 and res["poisoned_record"]["nonfinite"] == 1
        assert res["after_poison"] == res["before_poison"]     # codes, phase, signal sums: as before the step
        assert res["before_poison"]["signals"]["n_energy"] != [0] * len(res["before_poison"]["codes"])


def test_resume_restores_the_plan_and_matches(results: list[dict]) -> None:
    for res in results:
        assert res["loaded_state"] == res["saved_state"]          # codes, dwell, phase, lr, signals: bitwise
        assert res["saved_state"]["decisions"] == 2 and any(res["saved_state"]["codes"])
        for name, value in res["params"].items():
            assert torch.equal(value, res["resumed_params"][name]), name
        straight = _by_step(res["records"])
        for rec in res["resumed_records"]:
            assert _untimed(rec) == _untimed(straight[int(rec["step"])]), rec["step"]
            assert set(rec) == set(straight[int(rec["step"])])


def test_heatmap_of_the_allocation(results: list[dict], tmp_path) -> None:
    """The run's per-group levels, step by step, are what runners/auto_heatmap.py draws."""
    from runners.auto_heatmap import level_grid, plot
    records = results[0]["records"]
    groups, steps, grid = level_grid(records)
    assert steps == [int(r["step"]) for r in records] and "128x128" in groups
    for g, row in zip(groups, grid):
        assert row == [r[f"auto/level/{g}"] for r in records], g
    assert plot(records, tmp_path / "auto_levels.png").stat().st_size > 0
    from runners.auto_heatmap import legend
    rungs = legend(records, grid)
    assert rungs[0] == (0.0, "dense") and [v for v, _ in rungs[1:]] == sorted((v for v, _ in rungs[1:]), reverse=True)
    assert all(name == f"rank {v:g}" for v, name in rungs[1:])


def test_a_step_off_its_prediction_re_times_the_link_on_every_rank(results: list[dict]) -> None:
    """The trigger is the agreed measured step (the ranks' mean), so both ranks enter the re-timing collectives at
    the same decisions and keep deciding alike. Decisions every 2 steps from step 2: step 2 has no measured step
    yet (step 0's time is unknown), step 4 makes the first prediction, step 6 is the first that can be off it.
    The steps slow down, so interval 4–6 and 6–8 measure over their predictions and the link is re-timed at 8;
    after that (the re-timing's own probes lengthen the next interval) the rule is replayed from the records: a
    decision re-times when it and the one before were off in the same direction, the pair starting afresh after
    each re-timing."""
    r0, r1 = results
    assert r0["refit_events"] == r1["refit_events"] and r0["refit_records"] == r1["refit_records"]
    assert r0["refit_events"] and {e["reason"] for e in r0["refit_events"]} == {"step_off"}
    by_step = {int(r["step"]): r for r in r0["refit_records"]}
    expected, before = [], 0
    for d in range(6, max(by_step) + 1, 2):
        ratio = by_step[d]["auto/measured_step_s"] / by_step[d - 2]["auto/predicted_step_s"]
        sign = 0 if abs(ratio - 1.0) <= 1e-9 else (1 if ratio > 1.0 else -1)
        if sign and sign == before:
            expected.append(d)
            sign = 0
        before = sign
    assert expected[0] == 8 and [e["step"] for e in r0["refit_events"]] == expected
    last = r0["refit_records"][-1]
    assert r0["refit_records"][3]["auto/predicted_step_s"] == 0.0 < r0["refit_records"][4]["auto/predicted_step_s"]
    assert last["auto/predicted_step_s"] > 0 and last["auto/measured_step_s"] > 0
    for name, value in r0["refit_params"].items():
        assert torch.equal(value, r1["refit_params"][name]), name


def test_a_raised_group_is_reprojected_for_one_step_on_both_ranks(results: list[dict]) -> None:
    """Rank 2 → rank 8 at step 4: that step sends the group plain and measures every rank of its ladder (the
    power iteration on the exact average, as on a dense step); rank 8 from step 5. Rank 2 after the all-dense
    start needs no re-projection."""
    from ds_gravac.adapt.auto.ladder import RANKS
    r0, r1 = (res["scripted"] for res in results)
    assert r0["records"] == r1["records"] and r0["signals"] == r1["signals"] and r0["reprojected"] == r1["reprojected"]
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name
    assert r0["reprojected"] == {2: [], 4: ["128x128"], 6: []}
    b = {int(r["step"]): r["bytes_sent"] for r in r0["records"]}
    assert b[2] == b[3] < b[5] == b[6] < b[4] < b[1]      # rank 2 < rank 8 < plain 128×128 < all dense
    assert [r["branch"] for r in r0["records"]] == ["dense", "dense"] + ["cand"] * 5
    measured = lambda step: [r for r in r0["ladder"] if r0["signals"][step][2][RANKS.index(r)] is not None]  # noqa
    assert measured(3) == [r for r in r0["ladder"] if r <= 2]        # a rank-2 step measures rank 2 only
    assert measured(4) == r0["ladder"]                               # the re-projection: every rank
    assert measured(5) == [r for r in r0["ladder"] if r <= 8]


def test_a_rank_behind_a_slower_link_changes_nothing_between_the_ranks(results: list[dict]) -> None:
    """Rank 1 times its all-reduce probes 100x slower: the agreed fit is the MAX of the ranks' own fits (each
    refitted here by least squares from the samples it took), and both ranks apply the same codes and parameters."""
    from ds_gravac.sync.cost_model.fits import least_squares
    r0, r1 = (res["one_slow"] for res in results)
    local = [least_squares(r["samples"]["all_reduce"]) for r in (r0, r1)]
    # The ranks really disagree on their own: compare whole lines at the largest probe, not the slope alone
    # (a least-squares slope can clamp to 0 on noisy timings and leave the difference in the intercept).
    largest = max(x for _, x, _ in r1["samples"]["all_reduce"])
    assert local[1](largest) > 10 * local[0](largest)
    assert r0["fits"] == r1["fits"]
    a, b = r0["fits"]["all_reduce"]
    assert a == pytest.approx(max(f.a for f in local), rel=1e-9, abs=1e-15)
    assert b == pytest.approx(max(f.b for f in local), rel=1e-9)
    assert r0["records"] == r1["records"]
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name
