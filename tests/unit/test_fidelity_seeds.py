"""The multi-seed fidelity summary judges the bounds on the means of the seeds (hand-made per-seed reports); the
sweep's picks and the leading table: test_fidelity_sweep_and_lead."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity_lead import lead_markdown
from ds_gravac_bench.fidelity_seeds import combine, markdown
from seeds_cases import _row, _seed


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


def test_reports_of_one_dense_run_under_different_targets_are_refused(tmp_path: Path) -> None:
    """The same dense run saved under two held-out target rules (its steps to the target moved): not one table."""
    a, b = _seed(tmp_path / "a", 0.4, 0.84, []), _seed(tmp_path / "b", 0.4, 0.84, [])
    for root, target, reach in ((a, 0.835, 6000), (b, 0.80, 4400)):
        table = json.loads((root / "fidelity.json").read_text())
        table["top1_target"], table["systems"][0]["steps_to_top1"] = target, reach
        (root / "fidelity.json").write_text(json.dumps(table))
    with pytest.raises(SystemExit, match="top1_target 0.835 vs 0.8; dense's steps_to_top1 6000 vs 4400"):
        combine([[a, b]])
    combine([[a, a]])


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


def test_kept_reports_get_their_time_to_target_from_the_cluster_runs(tmp_path: Path) -> None:
    """A seed given as a kept report (no loss curves) is timed as its runs would be: a static row's steps to target
    × its cluster step (a dense start at the cluster's dense step), a GraVAC row from its own cluster run."""
    from fidelity_report_cases import DENSE, GRAVAC, STATIC, _write_run

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


def test_a_cluster_directory_without_a_system_keeps_the_time_a_kept_report_holds_for_it(tmp_path: Path) -> None:
    """Saving one controller's run at a rate (its directory holds only that system) keeps every other row's time at
    that rate: once, "no cluster run" replaced the kept times of dense, ddp_bf16 and rank 16 at 100 Mbit/s."""
    from fidelity_report_cases import DENSE, _write_run, loop_and_cluster

    from ds_gravac_bench.fidelity import build
    from ds_gravac_bench.fidelity_seeds import seed_table

    loop, steps = loop_and_cluster(tmp_path)
    other = _write_run(tmp_path / "other", "mlp", {   # another system's whole run at the same rate
        "gv_auto": {"loss": DENSE, "time": 0.2, "bytes": 10.0, "gravac": {"mode": "auto", "compressor": "powersgd"}}})
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "fidelity.json").write_text(json.dumps(build(loop, {"100mbit": [steps]})))
    before = {r["id"]: r["rates"]["100mbit"] for r in seed_table([kept], {})["systems"]}
    assert before["gv_topk_100"]["step_s"] == pytest.approx(0.5)
    for dirs in ([kept], [loop, kept]):        # a kept report alone, or behind a run directory (long_keep save)
        after = {r["id"]: r["rates"]["100mbit"] for r in seed_table(dirs, {"100mbit": [other]})["systems"]}
        assert after["ds_dense"] == before["ds_dense"] and after["gv_topk_100"] == before["gv_topk_100"]


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


def test_the_leading_table_shows_perplexity_as_mean_and_spread_over_the_seeds(tmp_path: Path) -> None:
    """Issue 41: final held-out metrics as mean ± spread. Perplexities 160, 170, 180 on three seeds: mean 170,
    sample standard deviation sqrt((10² + 0 + 10²) / 2) = 10; one seed shows its value alone, as before."""
    def seed(root: Path, ppl: float) -> Path:
        root.mkdir()
        rows = [{**_row("ds_dense", "dense", 5.0, 5.0, 0.0, 110, 1.0), "eval": {"eval/ppl": 150.0}},
                {**_row("topk", "sparse", 5.1, 5.0, 0.0, 112, 0.2), "eval": {"eval/ppl": ppl}}]
        (root / "fidelity.json").write_text(json.dumps({"model": "lstm", "steps": 150, "reference": "ds_dense",
                                                        "systems": rows}))
        return root

    three = combine([[seed(tmp_path / s, p)] for s, p in (("a", 160.0), ("b", 170.0), ("c", 180.0))])
    md = lead_markdown(three)
    assert "| ppl 170.0 ± 10.0 |" in md and "final held-out perplexity (mean ± sd)" in md
    one = lead_markdown(combine([[tmp_path / "a"]]))
    assert "| ppl 160.0 |" in one and "final held-out perplexity (mean) |" in one


def test_a_time_priced_per_branch_survives_a_later_save_of_the_run_without_it(tmp_path: Path) -> None:
    """A controller's row kept with its time at 100 Mbit/s priced per branch (no median step there) and saved again
    from its run at 1 Gbit/s ("trained at 1gbit" at 100 Mbit/s, no time) keeps the price; combined, the row is
    priced at 100 Mbit/s and its own run at 1 Gbit/s."""
    from ds_gravac_bench.fidelity_seeds import seed_table

    priced = {"step_s": None, "time_s": 700.0, "top1_time_s": 900.0, "source": "priced per branch",
              "reference": {"system": "ddp_bf16", "step_s": 2.0}}
    own = {"step_s": 0.5, "time_s": 100.0, "top1_time_s": 150.0, "source": "cluster run"}
    untimed = {"step_s": None, "time_s": None, "top1_time_s": None, "source": "trained at 1gbit"}

    def report(root: Path, at_100: dict) -> Path:
        gv = {**_row("gv_gravac at 1gbit", "sparsification", 0.5, 0.5, 0.34, 200, 0.4), "trained_at": "1gbit",
              "adaptive": True, "section_hash": "abc@1gbit", "rates": {"1gbit": own, "100mbit": at_100}}
        return _seed(root, 0.5, 0.34, [gv])

    later, earlier = report(tmp_path / "later", untimed), report(tmp_path / "earlier", priced)
    rates = {r["id"]: r for r in seed_table([later, earlier], {})["systems"]}["gv_gravac at 1gbit"]["rates"]
    assert rates == {"1gbit": own, "100mbit": priced}
    row = {r["id"]: r for r in combine([[later, earlier]])["systems"]}["gv_gravac at 1gbit"]
    assert row["priced_at"] == ["100mbit"] and row["time_s"] == {"1gbit": 100.0, "100mbit": 700.0}
