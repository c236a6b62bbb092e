"""The multi-seed fidelity summary judges the bounds on the means of the seeds (hand-made per-seed reports)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from ds_gravac_bench.fidelity_seeds import combine, markdown


def _row(sid: str, family: str, final: float, dense: float, top1: float, reach: int, bytes_ratio: float) -> dict:
    return {"id": sid, "family": family, "final_loss": final, "dense_loss": dense, "gap": final / dense - 1,
            "bytes_ratio": bytes_ratio, "rises": False, "steps_to_target": reach, "eval": {"eval/top1": top1}}


def _seed(root: Path, dense: float, dense_top1: float, rows: list[dict]) -> Path:
    root.mkdir()
    table = {"model": "resnet101", "steps": 300, "reference": "ds_dense",
             "systems": [_row("ds_dense", "dense", dense, dense, dense_top1, 200, 1.0)] + rows}
    (root / "fidelity.json").write_text(json.dumps(table))
    return root


def test_bounds_are_judged_on_the_means(tmp_path: Path) -> None:
    s0 = _seed(tmp_path / "s0", 0.4, 0.84, [_row("even", "low-rank", 0.5, 0.4, 0.83, 220, 0.07),
                                            _row("behind", "sparse", 0.44, 0.4, 0.80, 250, 0.02),
                                            _row("only_seed0", "sparse", 0.4, 0.4, 0.84, 200, 0.02)])
    s1 = _seed(tmp_path / "s1", 0.8, 0.76, [_row("even", "low-rank", 0.7, 0.8, 0.77, 180, 0.07),
                                            _row("behind", "sparse", 0.88, 0.8, 0.70, None, 0.04)])
    res = combine([[s0], [s1]])
    rows = {r["id"]: r for r in res["systems"]}
    assert set(rows) == {"ds_dense", "even", "behind"}          # a system missing from a seed is not averaged
    even, behind = rows["even"], rows["behind"]
    # even: +25% and -12.5% (0.7/0.8 rounds to -13%) on single seeds, but the means are 0.6 against 0.6
    assert abs(even["final_loss"] - 0.6) < 1e-12 and abs(even["dense_loss"] - 0.6) < 1e-12
    assert abs(even["gap"]) < 1e-12 and even["verdict"] == "ok"
    assert even["steps_to_target"] == [220, 180] and even["dense_steps_to_target"] == [200, 200]
    # behind: +10% on both seeds; top-1 0.75 against 0.80 on the mean; bytes 0.03 on the mean
    assert abs(behind["gap"] - 0.10) < 1e-12
    assert abs(behind["top1"] - 0.75) < 1e-12 and abs(behind["dense_top1"] - 0.80) < 1e-12
    assert abs(behind["bytes_ratio"] - 0.03) < 1e-12
    assert behind["verdict"] == "mean loss +10%, mean top-1"
    md = markdown(res)
    assert "| even | +25%, -13% |" in md and "220 (200), 180 (200)" in md and "– (200)" in md


def test_time_to_target_is_averaged_over_the_seeds(tmp_path: Path) -> None:
    def timed(row: dict, seconds: float | None) -> dict:
        return {**row, "rates": {"1gbit": {"step_s": 1.0, "time_s": seconds}}}

    def seed(root: Path, dense_s: float, fast_s: float, missed_s: float | None) -> Path:
        root.mkdir()
        rows = [timed(_row("ds_dense", "dense", 0.5, 0.5, 0.8, 200, 1.0), dense_s),
                timed(_row("fast", "low-rank", 0.5, 0.5, 0.8, 210, 0.07), fast_s),
                timed(_row("missed", "sparse", 0.5, 0.5, 0.8, None, 0.02), missed_s)]
        (root / "fidelity.json").write_text(json.dumps({"model": "resnet101", "steps": 300,
                                                        "reference": "ds_dense", "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a", 400.0, 100.0, 50.0)], [seed(tmp_path / "b", 600.0, 300.0, None)]])
    rows = {r["id"]: r for r in res["systems"]}
    assert rows["fast"]["time_s"] == {"1gbit": 200.0} and rows["fast"]["dense_time_s"] == {"1gbit": 500.0}
    assert rows["fast"]["speedup"] == {"1gbit": 2.5}                 # 500 s / 200 s, not the mean of 4× and 2×
    assert rows["missed"]["time_s"] == {"1gbit": None} and rows["missed"]["speedup"] == {"1gbit": None}
    md = markdown(res)
    assert "| 200 (2.50×) |" in md and "1gbit mean time to target s (× dense)" in md


def test_one_configuration_under_two_ids_is_matched_by_its_section(tmp_path: Path) -> None:
    """A seed that ran the recommended file as ``cfg:`` and another that ran the same section as a matrix id."""
    def hashed(row: dict, section_hash: str) -> dict:
        return {**row, "section_hash": section_hash}

    def seed(root: Path, sid: str, final: float) -> Path:
        root.mkdir()
        rows = [hashed(_row("ds_dense", "dense", 0.5, 0.5, 0.8, 200, 1.0), "dense0"),
                hashed(_row(sid, "sparse", final, 0.5, 0.8, 210, 0.2), "topk10"),
                hashed(_row("other", "sparse", 0.6, 0.5, 0.8, 250, 0.2), "topk100")]
        (root / "fidelity.json").write_text(json.dumps({"model": "lstm", "steps": 150, "reference": "ds_dense",
                                                        "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a", "gv_topk_10", 0.51)], [seed(tmp_path / "b", "lstm_recommended", 0.53)]])
    rows = {r["id"]: r for r in res["systems"]}
    assert set(rows) == {"ds_dense", "gv_topk_10", "other"}
    assert rows["gv_topk_10"]["also"] == ["lstm_recommended"]
    assert abs(rows["gv_topk_10"]["final_loss"] - 0.52) < 1e-12      # both seeds averaged
    md = markdown(res)
    assert "| gv_topk_10 (also lstm_recommended) | +2%, +6% |" in md


def test_language_models_show_the_mean_perplexity(tmp_path: Path) -> None:
    def seed(root: Path, dense_ppl: float, ppl: float) -> Path:
        root.mkdir()
        rows = [{**_row("ds_dense", "dense", 5.0, 5.0, 0.0, 110, 1.0), "eval": {"eval/ppl": dense_ppl}},
                {**_row("topk", "sparse", 5.1, 5.0, 0.0, 112, 0.2), "eval": {"eval/ppl": ppl}}]
        (root / "fidelity.json").write_text(json.dumps({"model": "lstm", "steps": 150, "reference": "ds_dense",
                                                        "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a", 140.0, 160.0)], [seed(tmp_path / "b", 160.0, 170.0)]])
    row = next(r for r in res["systems"] if r["id"] == "topk")
    assert row["ppl"] == 165.0 and row["dense_ppl"] == 150.0 and row["verdict"] == "mean perplexity"
    assert "| ppl 165.0 (150.0), +10.0% |" in markdown(res)


def test_a_seed_that_ran_one_section_twice_contributes_its_first_row(tmp_path: Path) -> None:
    root = tmp_path / "a"
    root.mkdir()
    rows = [_row("ds_dense", "dense", 0.5, 0.5, 0.8, 200, 1.0), _row("first", "sparse", 0.55, 0.5, 0.8, 210, 0.2),
            _row("second", "sparse", 0.55, 0.5, 0.8, 210, 0.2)]
    for r, h in zip(rows, ["d", "same", "same"]):
        r["section_hash"] = h
    (root / "fidelity.json").write_text(json.dumps({"model": "lstm", "steps": 150, "reference": "ds_dense",
                                                    "systems": rows}))
    res = combine([[root]])
    assert [r["id"] for r in res["systems"]] == ["ds_dense", "first"]


def test_a_dense_control_is_judged_on_the_mean_loss_not_on_bytes(tmp_path: Path) -> None:
    s0 = _seed(tmp_path / "s0", 0.4, 0.84, [_row("ds_dense_jitter", "dense", 0.5, 0.4, 0.84, 210, 1.0)])
    s1 = _seed(tmp_path / "s1", 0.8, 0.76, [_row("ds_dense_jitter", "dense", 0.74, 0.8, 0.76, 195, 1.0)])
    rows = {r["id"]: r for r in combine([[s0], [s1]])["systems"]}
    assert rows["ds_dense"]["verdict"] == "reference"
    # means 0.62 against 0.6: +3.3%, inside the 5% bound; bytes 1.0 would fail a compressed row
    assert abs(rows["ds_dense_jitter"]["gap"] - (0.62 / 0.6 - 1)) < 1e-12
    assert rows["ds_dense_jitter"]["verdict"] == "control: ok"


def test_reports_of_one_dense_run_merge_into_one_seed(tmp_path: Path) -> None:
    """A later invocation that reproduced a seed's dense run adds its systems to that seed's kept report."""
    a0 = _seed(tmp_path / "a0", 0.4, 0.84, [_row("defaults", "quantization", 0.44, 0.4, 0.83, 215, 0.26)])
    b0 = _seed(tmp_path / "b0", 0.4, 0.84, [_row("jitter", "dense", 0.48, 0.4, 0.82, 220, 1.0),
                                            _row("defaults", "quantization", 9.0, 0.4, 0.1, 999, 0.26)])
    a1 = _seed(tmp_path / "a1", 0.8, 0.76, [_row("defaults", "quantization", 0.84, 0.8, 0.75, 190, 0.26)])
    b1 = _seed(tmp_path / "b1", 0.8, 0.76, [_row("jitter", "dense", 0.76, 0.8, 0.77, 180, 1.0)])
    rows = {r["id"]: r for r in combine([[a0, b0], [a1, b1]])["systems"]}
    assert set(rows) == {"ds_dense", "defaults", "jitter"}
    assert rows["defaults"]["gaps"] == [0.44 / 0.4 - 1, 0.84 / 0.8 - 1]     # the first report's row wins
    assert rows["jitter"]["steps_to_target"] == [220, 180]
    assert abs(rows["jitter"]["final_loss"] - 0.62) < 1e-12


def test_a_seed_merged_from_several_reports_takes_its_noise_floor_from_whichever_holds_the_control(
        tmp_path: Path) -> None:
    from ds_gravac_bench.fidelity_seeds import seed_table

    a = _seed(tmp_path / "a", 0.4, 0.84, [_row("gv_default", "quantization", 0.44, 0.4, 0.83, 215, 0.26)])
    b = _seed(tmp_path / "b", 0.4, 0.84, [_row("ds_dense_jitter", "dense", 0.42, 0.4, 0.85, 190, 1.0)])
    floor = seed_table([a, b], {})["noise_floor"]
    assert floor["gap"] == pytest.approx(0.42 / 0.4 - 1) and floor["top1_diff"] == pytest.approx(0.85 - 0.84)
    assert floor["steps_to_target"] == 190
    assert seed_table([a], {})["noise_floor"] is None


def test_a_merged_seed_keeps_every_reports_run_and_cluster_directories(tmp_path: Path) -> None:
    """A save that adds one controller's run at one rate keeps the rates and directories of the rows kept before
    (the report's rate columns are its ``clusters``; once, a save kept only the new rate's)."""
    from ds_gravac_bench.fidelity_seeds import seed_table

    a = _seed(tmp_path / "a", 0.4, 0.84, [_row("gv_auto at 100mbit", "low-rank", 0.41, 0.4, 0.84, 210, 0.06)])
    b = _seed(tmp_path / "b", 0.4, 0.84, [_row("gv_auto at 1gbit", "low-rank", 0.40, 0.4, 0.84, 200, 0.08)])
    for root, clusters, runs in ((a, {"100mbit": "runs/c-100mbit-v2"}, ["runs/s0"]),
                                 (b, {"1gbit": "runs/steps-1gbit, runs/c-1gbit", "100mbit": "runs/c-100mbit"},
                                  ["runs/s0", "runs/s0-more"])):
        table = json.loads((root / "fidelity.json").read_text())
        (root / "fidelity.json").write_text(json.dumps({**table, "clusters": clusters, "runs": runs}))
    merged = seed_table([a, b], {})
    assert merged["clusters"] == {"100mbit": "runs/c-100mbit-v2, runs/c-100mbit",
                                  "1gbit": "runs/steps-1gbit, runs/c-1gbit"}
    assert merged["runs"] == ["runs/s0", "runs/s0-more"]
    assert [r["id"] for r in merged["systems"]] == ["ds_dense", "gv_auto at 100mbit", "gv_auto at 1gbit"]


def test_reports_of_different_dense_runs_are_refused(tmp_path: Path) -> None:
    a = _seed(tmp_path / "a", 0.4, 0.84, [])
    b = _seed(tmp_path / "b", 0.41, 0.84, [_row("jitter", "dense", 0.48, 0.41, 0.82, 220, 1.0)])
    with pytest.raises(SystemExit, match="hold different dense runs"):
        combine([[a, b]])


def test_held_out_top1_is_paired_per_seed_beside_the_noise_floor(tmp_path: Path) -> None:
    """Three paired seeds: top-1 as mean ± sample sd, its per-seed difference to the same seed's dense run, the
    steps and mean time to the held-out target, and ds_dense_jitter's figures as the noise floor."""
    def seed(root: Path, dense_top1: float, mine: float, jitter: float, dense_loss: float, jitter_loss: float) -> Path:
        root.mkdir()
        timed = {"rates": {"1gbit": {"step_s": 1.0, "time_s": None, "top1_time_s": 0.0}}}
        rows = [{**_row("ds_dense", "dense", dense_loss, dense_loss, dense_top1, 200, 1.0), **timed,
                 "steps_to_top1": 400},
                {**_row("ds_dense_jitter", "dense", jitter_loss, dense_loss, jitter, 200, 1.0), **timed,
                 "steps_to_top1": 400},
                {**_row("mine", "quantization", dense_loss, dense_loss, mine, 210, 0.25), "steps_to_top1": 300,
                 "rates": {"1gbit": {"step_s": 0.5, "time_s": None, "top1_time_s": 150.0}}}]
        rows[0]["rates"]["1gbit"]["top1_time_s"] = rows[1]["rates"]["1gbit"]["top1_time_s"] = 400.0
        (root / "fidelity.json").write_text(json.dumps({"model": "resnet18", "steps": 6000,
                                                        "reference": "ds_dense", "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a", 0.80, 0.79, 0.81, 1.0, 1.02)],
                   [seed(tmp_path / "b", 0.82, 0.80, 0.82, 1.0, 0.98)],
                   [seed(tmp_path / "c", 0.84, 0.84, 0.83, 1.0, 1.0)]])
    rows = {r["id"]: r for r in res["systems"]}
    mine = rows["mine"]
    assert mine["top1_spread"]["mean"] == pytest.approx(0.81) and mine["top1_spread"]["n"] == 3
    assert mine["top1_spread"]["sd"] == pytest.approx(((0.02 ** 2 + 0.01 ** 2 + 0.03 ** 2) / 2) ** 0.5)
    assert mine["top1_diff"]["mean"] == pytest.approx(-0.01)          # -0.01, -0.02, 0.00
    assert mine["top1_diff"]["sd"] == pytest.approx(0.01)
    assert mine["steps_to_top1"] == [300, 300, 300] and mine["dense_steps_to_top1"] == [400, 400, 400]
    assert mine["top1_time_s"] == {"1gbit": 150.0} and mine["top1_speedup"] == {"1gbit": pytest.approx(400 / 150)}
    floor = res["noise_floor"]
    assert floor["gaps"] == pytest.approx([0.02, -0.02, 0.0]) and floor["top1_diff"]["mean"] == pytest.approx(0.0)
    md = markdown(res)
    assert "+0.0% (noise floor 1.3%)" in md                           # mean |gap| of the jitter: 4% / 3
    assert "| mine | 81.0 ± 2.6 | -1.00 ± 1.00 | 300 (400), 300 (400), 300 (400) | 150 (2.67×) |" in md
    assert "top-1 − dense, points (noise floor +0.00 ± 1.00)" in md


def test_the_sweep_picks_per_family_the_soonest_level_within_the_bounds(tmp_path: Path) -> None:
    """Tuning seeds: Top-k 100× reaches the target sooner than 10× but misses top-1 on the means, so 10× is the
    sparsifier pick; PowerSGD rank 4 beats rank 1 on steps; no quantizer passes; GraVAC is never a static pick."""
    from ds_gravac_bench.fidelity_sweep import pick

    def seed(root: Path, shift: int) -> Path:
        return _seed(root, 0.5, 0.8, [_row("gv_topk_10", "sparsification", 0.5, 0.5, 0.8, 220 + shift, 0.1),
                                      _row("gv_topk_100", "sparsification", 0.5, 0.5, 0.7, 200 + shift, 0.01),
                                      _row("gv_powersgd_r1", "low-rank", 0.5, 0.5, 0.8, 260 + shift, 0.01),
                                      _row("gv_powersgd_r4", "low-rank", 0.5, 0.5, 0.8, 230 + shift, 0.04),
                                      {**_row("gv_gravac", "sparsification", 0.5, 0.5, 0.8, 100, 0.01),
                                       "adaptive": True},     # as every report row says (fidelity._row)
                                      _row("gv_onebit", "quantization", 0.9, 0.5, 0.8, None, 0.03)])

    res = combine([[seed(tmp_path / "a", 0)], [seed(tmp_path / "b", 10)]])
    picks = pick(res)
    assert picks["sparsification"] == {"id": "gv_topk_10", "sort_key": [225.0, 0.1]}
    assert picks["low-rank"]["id"] == "gv_powersgd_r4" and picks["quantization"] is None


def test_kept_reports_get_their_time_to_target_from_the_cluster_runs(tmp_path: Path) -> None:
    """A seed given as a kept report (no loss curves) is timed as its runs would be: a static row's steps to target
    × its cluster step (a dense start at the cluster's dense step), a GraVAC row from its own cluster run."""
    from test_fidelity_report import DENSE, GRAVAC, STATIC, _write_run

    from ds_gravac_bench.fidelity import build

    warm = {**STATIC, "warmup_steps": 10}
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC},
        "warm": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": warm},
        "gv_gravac": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": GRAVAC}})
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "topk_under_another_id": {"loss": DENSE[:20], "time": 0.5, "bytes": 10.0, "gravac": STATIC},
        "warm": {"loss": DENSE[:16], "time": [9.0] + [1.5] * 9 + [0.25] * 6, "bytes": 10.0, "gravac": warm},
        "gv_gravac": {"loss": DENSE, "time": [0.3] * 100, "bytes": 10.0, "gravac": GRAVAC}})
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "fidelity.json").write_text(json.dumps(build(loop, {})))      # a report made without any cluster
    from_report = {r["id"]: r for r in combine([[kept]], {"1gbit": [cluster]})["systems"]}
    from_runs = {r["id"]: r for r in combine([[loop]], {"1gbit": [cluster]})["systems"]}
    reach = from_report["ds_dense"]["steps_to_target"][0]
    assert from_report["ds_dense"]["time_s"] == {"1gbit": pytest.approx(reach * 2.0)}
    assert from_report["gv_topk_100"]["time_s"] == {"1gbit": pytest.approx(reach * 0.5)}
    assert from_report["gv_topk_100"]["speedup"] == {"1gbit": pytest.approx(4.0)}
    assert from_report["warm"]["time_s"] == {"1gbit": pytest.approx(10 * 1.5 + (reach - 10) * 0.25)}
    assert from_report["gv_gravac"]["time_s"] == {"1gbit": pytest.approx(reach * 0.3)}   # its own run's steps
    for sid, row in from_runs.items():
        assert from_report[sid]["time_s"] == row["time_s"] and from_report[sid]["speedup"] == row["speedup"]


def test_the_summary_names_seeds_without_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "runs").mkdir()
    s0 = _seed(tmp_path / "runs" / "s0", 0.4, 0.84, [])       # below the working directory: named relative to it
    s1 = _seed(tmp_path / "s1", 0.8, 0.76, [])                # elsewhere: named by its last component
    monkeypatch.chdir(tmp_path / "runs")
    res = combine([[s0.resolve()], [s1.resolve()]])
    assert res["seeds"] == [["s0"], ["s1"]] and str(tmp_path) not in json.dumps(res)


def test_a_controller_trained_on_the_cluster_pairs_its_seeds_per_rate(tmp_path: Path) -> None:
    """Each seed's run of auto at 1 Gbit/s is one sample of the row ``gv_auto at 1gbit``; a kept report built with
    its clusters keeps that row's time when the seeds are combined with clusters again."""
    from test_fidelity_report import DENSE, SLOW, _write_run

    from ds_gravac_bench.fidelity import build

    auto = {"mode": "auto", "compressor": "powersgd"}

    def seed(name: str, auto_loss: list[float], step_s: float) -> tuple[Path, Path]:
        extra = {"runner_extra": ["--seed", name]}
        loop = _write_run(tmp_path / name / "loop", "mlp", {
            "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None}}, **extra)
        cluster = _write_run(tmp_path / name / "c1g", "mlp", {
            "ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1000.0, "gravac": None},
            "gv_auto": {"loss": auto_loss, "time": step_s, "bytes": 10.0, "gravac": auto}}, **extra)
        return loop, cluster

    (loop_a, c_a), (loop_b, c_b) = seed("a", DENSE, 0.25), seed("b", SLOW, 0.5)
    rows = {r["id"]: r for r in combine([[loop_a], [loop_b]], {"1gbit": [c_a, c_b]})["systems"]}
    auto_row = rows["gv_auto at 1gbit"]                     # each seed finds its own run among both
    reach = auto_row["dense_steps_to_target"][0]
    assert auto_row["steps_to_target"] == [reach, None]    # seed b's run (SLOW) never reaches the target
    assert auto_row["time_s"] == {"1gbit": None} and auto_row["verdict"].startswith("mean loss +")
    only_a = {r["id"]: r for r in combine([[loop_a], [loop_b]], {"1gbit": [c_a]})["systems"]}
    assert "gv_auto at 1gbit" not in only_a                 # seed b has no run of it: not averaged
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "fidelity.json").write_text(json.dumps(build(loop_a, {"1gbit": [c_a]})))
    from_report, from_runs = ({r["id"]: r for r in combine([[d]], {"1gbit": [c_a]})["systems"]}["gv_auto at 1gbit"]
                              for d in (kept, loop_a))
    assert from_report["time_s"] == from_runs["time_s"] == {"1gbit": pytest.approx(0.25 * reach)}


def test_the_sweep_cost_sums_every_recorded_run(tmp_path: Path) -> None:
    """The sweep's cost is what bench_e2e recorded per system (a continued run's invocations already summed), so an
    interrupted sweep that is run again reports the whole cost, not the last invocation's."""
    from ds_gravac_bench.fidelity_sweep import runs_cost

    for name, systems in (("s100", {"ds_dense": {"cpu_s": 100.0, "wall_s": 60.0}, "gv_topk_10": {"cpu_s": 50.5}}),
                          ("s101", {"ds_dense": {"cpu_s": 20.0, "wall_s": 12.5}, "failed": {"returncode": 1}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps({"systems": systems}))
    assert runs_cost([tmp_path / "s100", tmp_path / "s101"]) == {"cpu_s": 170.5, "wall_s": 72.5}


def test_post_local_sgd_period_is_picked_on_time_at_a_rate_never_on_steps(tmp_path: Path) -> None:
    """Period 8 reaches the target in fewer steps than period 32, but at 100 Mbit/s period 32's cheaper steps reach
    it sooner: the pick at that rate is 32, and without a rate there is no local-SGD pick at all."""
    from ds_gravac_bench.fidelity_sweep import pick

    def timed(row: dict, seconds: float) -> dict:
        return {**row, "rates": {"100mbit": {"step_s": 1.0, "time_s": seconds}}}

    def seed(root: Path) -> Path:
        root.mkdir()
        rows = [timed(_row("ds_dense", "dense", 0.5, 0.5, 0.8, 200, 1.0), 900.0),
                timed(_row("ddp_localsgd@period=8", "baseline", 0.5, 0.5, 0.8, 210, 0.125), 300.0),
                timed(_row("ddp_localsgd@period=32", "baseline", 0.5, 0.5, 0.8, 240, 0.03), 120.0),
                timed(_row("ddp_localsgd@period=128", "baseline", 0.6, 0.5, 0.6, 300, 0.01), 60.0)]
        (root / "fidelity.json").write_text(json.dumps({"model": "resnet18", "steps": 300, "reference": "ds_dense",
                                                        "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a")], [seed(tmp_path / "b")]])
    assert "ddp_localsgd" not in pick(res)
    assert pick(res, "100mbit")["ddp_localsgd"] == {"id": "ddp_localsgd@period=32", "sort_key": [120.0, 0.03]}


def test_the_leading_table_gives_time_to_the_held_out_target_against_ddp_with_the_bf16_hook(tmp_path: Path) -> None:
    """Two paired seeds: DDP + bf16 reaches the held-out target in 600 s and 400 s at 100 Mbit/s (mean 500), a
    compressor in 200 and 300 (mean 250): 2.00× sooner; one that misses it on a seed has no ratio; a controller
    trained at 1 Gbit/s only has figures there. Beside them: top-1 mean ± sd and its paired gap to dense."""
    from ds_gravac_bench.fidelity_lead import lead_markdown, ratios

    def seed(root: Path, base_s: float, mine_s: float, mine_top1: float) -> Path:
        root.mkdir()

        def row(sid: str, family: str, top1: float, rates: dict) -> dict:
            return {**_row(sid, family, 0.5, 0.5, top1, 200, 0.5 if family == "baseline" else 0.1),
                    "steps_to_top1": 400, "rates": rates}
        rows = [row("ds_dense", "dense", 0.34, {"100mbit": {"top1_time_s": 2000.0}}),
                row("ddp_bf16", "baseline", 0.34, {"100mbit": {"top1_time_s": base_s}}),
                row("mine", "low-rank", mine_top1, {"100mbit": {"top1_time_s": mine_s}}),
                row("late", "sparsification", 0.30, {"100mbit": {"top1_time_s": None if base_s > 500 else 90.0}}),
                {**row("gv_auto at 1gbit", "low-rank", 0.34, {"1gbit": {"top1_time_s": 100.0}}),
                 "trained_at": "1gbit"}]
        (root / "fidelity.json").write_text(json.dumps({"model": "resnet18", "steps": 6000,
                                                        "reference": "ds_dense", "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a", 600.0, 200.0, 0.33)], [seed(tmp_path / "b", 400.0, 300.0, 0.35)]])
    vs = ratios(res)
    assert vs["mine"] == {"100mbit": pytest.approx(2.0)} and vs["ddp_bf16"] == {"100mbit": pytest.approx(1.0)}
    assert vs["late"]["100mbit"] is None and vs["gv_auto at 1gbit"]["1gbit"] is None   # no baseline at 1gbit
    md = lead_markdown(res)
    assert "| mine | low-rank | 250 s (2.00×) | – | 34.00 ± 1.41 | +0.00 ± 1.41 | 0.100 | ok |" in md
    assert "| late | sparsification | – | – |" in md and "100mbit: time to held-out target (× ddp_bf16)" in md


def test_the_leading_table_says_where_post_local_sgd_beats_compression_beside_the_noise_floor(
        tmp_path: Path) -> None:
    """Two seeds at 100 Mbit/s. The jitter control reaches the held-out target 10% and 30% off dense's steps (floor
    ±20%). Post-local SGD's best period within the bounds takes 100 s (period 32; period 8 takes 150 s, period 128
    misses top-1). A compressor at 150 s is 1.50× later, one at 110 s is inside the floor, one at 50 s is 2.00×
    sooner, one never reaches the target."""
    from ds_gravac_bench.fidelity_lead import lead_markdown, steps_floor

    def seed(root: Path, jitter_steps: int) -> Path:
        root.mkdir()

        def row(sid: str, family: str, t: Optional[float], steps: int = 400, top1: float = 0.34) -> dict:
            return {**_row(sid, family, 0.5, 0.5, top1, 200, 0.5), "steps_to_top1": steps,
                    "rates": {"100mbit": {"top1_time_s": t}}}
        rows = [row("ds_dense", "dense", 400.0), row("ds_dense_jitter", "dense", 400.0, steps=jitter_steps),
                row("ddp_localsgd@period=8", "baseline", 150.0), row("ddp_localsgd@period=32", "baseline", 100.0),
                row("ddp_localsgd@period=128", "baseline", 20.0, top1=0.20),
                row("later", "low-rank", 150.0), row("close", "quantization", 110.0),
                row("sooner", "sparsification", 50.0), row("never", "low-rank", None)]
        (root / "fidelity.json").write_text(json.dumps({"model": "resnet18", "steps": 6000,
                                                        "reference": "ds_dense", "systems": rows}))
        return root

    res = combine([[seed(tmp_path / "a", 440)], [seed(tmp_path / "b", 280)]])
    assert steps_floor(res) == pytest.approx(0.2)
    line = next(x for x in lead_markdown(res).splitlines() if x.startswith("- 100mbit:"))
    assert line.startswith("- 100mbit: `ddp_localsgd@period=32` (100 s) against ")
    assert "`later` (150 s): post-local SGD 1.50× sooner" in line
    assert "`close` (110 s): no difference" in line
    assert "`sooner` (50 s): compression 2.00× sooner" in line
    assert "`never` (never reached the target): post-local SGD sooner" in line
    assert "noise floor ±20%" in lead_markdown(res)


def test_the_leading_table_pairs_static_rows_with_the_baseline_in_each_round_of_step_times(tmp_path: Path) -> None:
    """Rounds of step times at 1 Gbit/s: DDP + bf16 0.5, 0.6, 0.55 s; a static compressor 0.4, 0.5, 0.5 s. With 4,800
    and (4,000 + 4,400) / 2 = 4,200 steps to the held-out target, the paired ratios per round are 4800·0.5 /
    (4200·0.4) = 1.43, 4800·0.6 / (4200·0.5) = 1.37 and 4800·0.55 / (4200·0.5) = 1.26. A controller's own run and a
    row priced otherwise (post-local SGD's mixed steps) get no range, even when the rounds list their id."""
    from ds_gravac_bench.fidelity_lead import lead_markdown, round_ratios
    from ds_gravac_bench.fidelity_time import ONE_STEP

    def seed(root: Path, mine_steps: int) -> Path:
        root.mkdir()

        def row(sid: str, family: str, steps: int, t: float, source: str = ONE_STEP) -> dict:
            return {**_row(sid, family, 0.5, 0.5, 0.34, 200, 0.5), "steps_to_top1": steps,
                    "rates": {"1gbit": {"top1_time_s": t, "source": source}}}
        rows = [row("ds_dense", "dense", 5600, 4000.0), row("ddp_bf16", "baseline", 4800, 2500.0),
                row("mine", "low-rank", mine_steps, 2000.0),
                row("ddp_localsgd@period=8", "baseline", 5000, 1500.0, source="mixed steps"),
                {**row("gv_auto at 1gbit", "low-rank", 4600, 2700.0, source="cluster run"), "trained_at": "1gbit"}]
        (root / "fidelity.json").write_text(json.dumps({"model": "resnet18", "steps": 6000,
                                                        "reference": "ds_dense", "systems": rows}))
        return root

    medians = {"ddp_bf16": [0.5, 0.6, 0.55], "mine": [0.4, 0.5, 0.5], "ddp_localsgd@period=8": [0.3, 0.3, 0.3],
               "gv_auto at 1gbit": [0.4, 0.4, 0.4], "short": [0.4]}
    kept = tmp_path / "rounds.json"
    kept.write_text(json.dumps({"rates": {"1gbit": {"rounds": 3, "systems": {
        sid: {"round_medians": m} for sid, m in medians.items()}}}}))
    res = combine([[seed(tmp_path / "a", 4000)], [seed(tmp_path / "b", 4400)]], rounds={"1gbit": kept})
    assert set(res["rounds"]["1gbit"]["systems"]) == set(medians) - {"short"}      # a system missing rounds: left out
    paired = round_ratios(res)
    lo, mid, hi = paired["mine"]["1gbit"]
    assert (lo, mid, hi) == pytest.approx((4800 * 0.55 / (4200 * 0.5), 4800 * 0.6 / (4200 * 0.5),
                                           4800 * 0.5 / (4200 * 0.4)), rel=1e-12)
    assert not {"ddp_bf16", "ddp_localsgd@period=8", "gv_auto at 1gbit"} & set(paired)
    md = lead_markdown(res)
    assert "| mine | low-rank | 2000 s (1.25×; rounds 1.26–1.43×) |" in md
    assert "1gbit: 3 rounds" in md
    with pytest.raises(SystemExit, match="no rounds at 100mbit"):
        combine([[seed(tmp_path / "c", 4000)]], rounds={"100mbit": kept})
