"""The fidelity report's arithmetic on hand-made step files: target, steps to target, time at a rate (loopback steps
× cluster step for static rows, the cluster run itself for GraVAC rows), speed-ups and the accuracy bounds (the long
tasks' rows: test_fidelity_report_long)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity import build, report
from ds_gravac_bench.fidelity_output import markdown
from ds_gravac_bench.report import smooth
from ds_gravac_bench.systems import config_system, resolve_system, system_matrix
from fidelity_report_cases import DENSE, GRAVAC, SLOW, STATIC, _write_run, loop_and_cluster
from fidelity_report_cases import dirs  # noqa: F401 (a pytest fixture)


@pytest.mark.parametrize("section", [{"mode": "auto", "compressor": "powersgd"},
                                     {"mode": "accordion", "compressor": "topk", "accordion": {"interval_steps": 10}}])
def test_a_controller_that_changes_levels_is_timed_by_its_own_cluster_run(tmp_path: Path, section: dict) -> None:
    """auto decides from the measured link and Accordion changes its level over training, so neither has one step
    time: the row takes loss and time from its own cluster run (here 0.25 s a step, reaching the target at the
    same step as on loopback), never loopback steps × the cluster run's median step."""
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "gv_ctl": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": section}})
    times = [4.0] * 30 + [0.25] * 70
    cluster = _write_run(tmp_path / "c", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "gv_ctl": {"loss": DENSE, "time": times, "bytes": 10.0, "gravac": section}})
    rows = {r["id"]: r for r in build(loop, {"1gbit": cluster})["systems"]}
    reach = rows["ds_dense"]["steps_to_target"]
    got = rows["gv_ctl"]["rates"]["1gbit"]
    assert got["source"] == "cluster run" and got["time_s"] == pytest.approx(sum(times[:reach]))
    assert got["time_s"] > 2 * 0.25 * reach


def test_ddp_fp32_takes_dense_curve_on_a_long_task_and_its_own_cluster_step(tmp_path: Path) -> None:
    """On the long tasks DDP's fp32 all-reduce is not trained on loopback (bitwise ds_dense's at two ranks): its row
    is dense's steps to target × its own cluster step; a task without that rule, or four ranks, gets no such row,
    and a pair whose source did not run (ds_bf16 from ddp_bf16) gets none either."""
    task = {"task": "mlp_screen", "target_fraction": 0.75, "top1_margin": None}
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None}}, fidelity=task, N=2)
    cluster = _write_run(tmp_path / "c", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "ddp_dense": {"loss": DENSE[:20], "time": 1.5, "bytes": 1000.0, "gravac": None}})
    rows = {r["id"]: r for r in build(loop, {"1gbit": cluster})["systems"]}
    reach = rows["ds_dense"]["steps_to_target"]
    assert rows["ddp_dense"]["steps_to_target"] == reach and "bitwise equal" in rows["ddp_dense"]["label"]
    assert rows["ddp_dense"]["rates"]["1gbit"]["time_s"] == pytest.approx(1.5 * reach)
    assert rows["ddp_dense"]["rates"]["1gbit"]["speedup"] == pytest.approx(2.0 / 1.5)
    assert "ds_bf16" not in rows
    report([loop], {"1gbit": [cluster]}, tmp_path / "report")              # the plots draw the borrowed row too
    assert (tmp_path / "report" / "plots" / "loss_vs_time_1gbit.png").is_file()
    for name, extra in (("short", {"fidelity": {**task, "task": "mlp"}, "N": 2}), ("four", {"fidelity": task, "N": 4})):
        other = _write_run(tmp_path / name, "mlp", {
            "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None}}, **extra)
        assert "ddp_dense" not in {r["id"] for r in build(other, {})["systems"]}


def test_target_steps_and_times(dirs: tuple[Path, Path]) -> None:
    loop, cluster = dirs
    res = build(loop, {"1gbit": cluster})
    target = smooth(DENSE)[74]
    assert res["target_loss"] == pytest.approx(target)
    rows = {r["id"]: r for r in res["systems"]}
    reach = next(i + 1 for i, s in enumerate(smooth(DENSE)) if s <= target)
    assert rows["ds_dense"]["steps_to_target"] == reach == rows["gv_topk_100"]["steps_to_target"]
    assert rows["ds_dense"]["rates"]["1gbit"]["time_s"] == pytest.approx(reach * 2.0)
    assert rows["gv_topk_100"]["rates"]["1gbit"]["time_s"] == pytest.approx(reach * 0.5)
    assert rows["gv_topk_100"]["rates"]["1gbit"]["speedup"] == pytest.approx(4.0)
    slow_reach = next((i + 1 for i, s in enumerate(smooth(SLOW)) if s <= target), None)
    assert slow_reach is None and rows["gv_slow"]["steps_to_target"] is None
    assert rows["gv_slow"]["rates"]["1gbit"]["time_s"] is None            # no cluster run and never reached
    assert rows["gv_gravac"]["rates"]["1gbit"]["source"] == "cluster run"
    assert rows["gv_gravac"]["rates"]["1gbit"]["time_s"] is None          # its cluster trajectory never reaches it


def test_verdicts_name_each_missed_bound(dirs: tuple[Path, Path]) -> None:
    loop, _ = dirs
    rows = {r["id"]: r for r in build(loop, {})["systems"]}
    assert rows["ds_dense"]["verdict"] == "reference"
    assert rows["gv_topk_100"]["verdict"] == "ok"                       # 1 point of top-1 lost is inside the bound
    gap = smooth(SLOW)[-1] / smooth(DENSE)[-1] - 1
    assert rows["gv_slow"]["gap"] == pytest.approx(gap)
    assert rows["gv_slow"]["verdict"] == f"loss +{100 * gap:.0f}%, top-1"
    assert rows["gv_topk_100"]["bytes_ratio"] == pytest.approx(0.01)
    assert "| gv_slow |" in markdown(build(loop, {}))


def test_rising_curve_and_heavy_bytes_fail(tmp_path: Path) -> None:
    bump = [3.0] + [3.5] * 10 + DENSE[11:]
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "bumpy": {"loss": bump, "time": 0.1, "bytes": 600.0, "gravac": STATIC}})
    row = next(r for r in build(loop, {})["systems"] if r["id"] == "bumpy")
    assert row["rises"] and row["verdict"] == "bytes, loss rises"


def test_the_default_section_is_judged_as_a_compressed_row_not_as_dense(tmp_path: Path) -> None:
    """An empty "gravac" section is the product's default (``auto`` over PowerSGD since 0.5; static QSGD before),
    so its row gets the bounds of its compressor's family; it once was taken for a dense reference and never
    judged."""
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "default": {"loss": SLOW, "time": 0.1, "bytes": 20.0, "gravac": {}}})
    row = next(r for r in build(loop, {})["systems"] if r["id"] == "default")
    assert row["family"] == "low-rank" and row["verdict"].startswith("loss +")


def test_config_systems_must_match_the_base(tmp_path: Path) -> None:
    base = {"optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "gravac": {"mode": "dense"}}
    same = tmp_path / "mine.json"
    same.write_text(json.dumps({**base, "gravac": STATIC}))
    spec = resolve_system(system_matrix(100), f"cfg:{same}", base)
    assert spec.id == "mine" and spec.gravac == STATIC and spec.system == "gravac"
    warm = resolve_system(system_matrix(100), f"cfg:{same}@warmup_steps=25@compressor.params.rank=4", base)
    assert warm.id == "mine@warmup_steps=25@compressor.params.rank=4"
    assert warm.gravac == {**STATIC, "warmup_steps": 25, "compressor": {"type": "topk", "params": {"rank": 4}}}
    assert STATIC == {"mode": "static", "compressor": "topk", "cf": 100}      # the file's section is not changed
    with pytest.raises(ValueError, match="expected @key=value"):
        resolve_system(system_matrix(100), f"cfg:{same}@no_such_key=1", base)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "gravac": STATIC}))
    with pytest.raises(ValueError, match="differ from the base config: optimizer"):
        config_system(str(other), base)
    with pytest.raises(ValueError, match="no such file"):
        config_system(str(tmp_path / "missing.json"), base)


def test_runs_merge_only_with_identical_dense_curves(tmp_path: Path) -> None:
    first = _write_run(tmp_path / "a", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": SLOW, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    second = _write_run(tmp_path / "b", "mlp", {
        "gv_dense": {"loss": DENSE[:50], "time": 0.1, "bytes": 1000.0, "gravac": {"mode": "dense"}},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC},   # first directory wins
        "gv_other": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    rows = {r["id"]: r for r in build([first, second], {})["systems"]}
    assert set(rows) == {"ds_dense", "gv_dense", "gv_topk_100", "gv_other"}
    assert rows["gv_topk_100"]["final_loss"] == pytest.approx(smooth(SLOW)[-1])
    third = _write_run(tmp_path / "c", "mlp", {
        "ds_dense": {"loss": [x + 1e-6 for x in DENSE], "time": 0.1, "bytes": 1000.0, "gravac": None}})
    with pytest.raises(SystemExit, match="dense loss curve of .* differs"):
        build([first, third], {})


def test_rows_carry_a_hash_of_what_they_train(tmp_path: Path) -> None:
    """Equal "gravac" sections under different ids (key order aside) share a hash; the multi-seed summary matches on it."""
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC},
        "mlp_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": dict(reversed(list(STATIC.items())))},
        "gv_gravac": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": GRAVAC},
        "ddp_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
    })
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None}})
    rows = {r["id"]: r for r in build(loop, {"1gbit": cluster})["systems"]}
    assert rows["gv_topk_100"]["section_hash"] == rows["mlp_topk_100"]["section_hash"]
    assert len({rows[s]["section_hash"] for s in ("ds_dense", "gv_topk_100", "gv_gravac", "ddp_dense")}) == 4
    # no section is not one configuration: DDP's dense path is not timed by DeepSpeed's cluster run
    assert rows["ddp_dense"]["rates"]["1gbit"]["time_s"] is None


def test_cluster_argument_takes_several_directories(tmp_path: Path) -> None:
    import argparse

    from ds_gravac_bench.fidelity_args import cluster_arg, clusters_of

    a = _write_run(tmp_path / "a", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1.0, "gravac": None}})
    b = _write_run(tmp_path / "b", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1.0, "gravac": None}})
    assert clusters_of([cluster_arg(f"1gbit={a},{b}"), cluster_arg(f"1gbit={a}")]) == {"1gbit": [a, b, a]}
    with pytest.raises(argparse.ArgumentTypeError, match="no meta.json"):
        cluster_arg(f"1gbit={a},{tmp_path}")
    with pytest.raises(argparse.ArgumentTypeError, match="RATE=DIR"):
        cluster_arg(str(a))


@pytest.mark.parametrize("typed, name", [("1gbit", "1gbit"), ("1000mbit", "1gbit"), ("1Gbit", "1gbit"),
                                         ("100mbit", "100mbit"), ("0.1gbit", "100mbit"), ("1.5gbit", "1500mbit"),
                                         ("250kbit", "250kbit")])
def test_a_rate_is_named_one_way(tmp_path: Path, typed: str, name: str) -> None:
    """Rates key rows and tables (``gv_auto at 1gbit``, issue 42's targets): one link, one name."""
    import argparse

    from ds_gravac_bench.fidelity import add_run_arguments
    from ds_gravac_bench.fidelity_args import cluster_arg, rate_file_arg

    a = _write_run(tmp_path / "a", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1.0, "gravac": None}})
    (tmp_path / "t.json").write_text("{}")
    assert cluster_arg(f"{typed}={a}") == (name, [a])
    assert rate_file_arg(f"{typed}={tmp_path / 't.json'}") == (name, tmp_path / "t.json")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert parser.parse_args(["--task", "mlp_screen", "--rate", typed]).rate == name


@pytest.mark.parametrize("typed", ["100mbps", "fast", "0mbit", "-1gbit"])
def test_a_misspelt_rate_fails_with_its_value(tmp_path: Path, typed: str) -> None:
    import argparse

    from ds_gravac_bench.fidelity import add_run_arguments
    from ds_gravac_bench.fidelity_args import cluster_arg

    a = _write_run(tmp_path / "a", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1.0, "gravac": None}})
    with pytest.raises(argparse.ArgumentTypeError, match=f"link rate: .*{typed}"):
        cluster_arg(f"{typed}={a}")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--task", "mlp_screen", "--rate", typed])
    assert parser.parse_args(["--task", "mlp_screen", "--rate", "loopback"]).rate == "loopback"


def test_a_dense_start_is_timed_at_the_dense_step(tmp_path: Path) -> None:
    """Static Top-k after 10 dense steps: the 10 dense steps cost the cluster run's dense step, the rest its
    compressed step; a cluster run that ends inside its warm-up gives no time rather than a wrong one."""
    warm = {**STATIC, "warmup_steps": 10}
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "warm": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": warm},
        "warm_short": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": warm}})
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "warm": {"loss": DENSE[:16], "time": [9.0] + [1.5] * 9 + [0.25] * 6, "bytes": 10.0, "gravac": warm},
        "warm_short": {"loss": DENSE[:11], "time": [1.5] * 11, "bytes": 10.0, "gravac": warm}})
    rows = {r["id"]: r for r in build(loop, {"1gbit": cluster})["systems"]}
    reach = rows["warm"]["steps_to_target"]
    at = rows["warm"]["rates"]["1gbit"]
    assert at["time_s"] == pytest.approx(10 * 1.5 + (reach - 10) * 0.25)
    assert at["step_s"] == 0.25 and at["dense_start_step_s"] == 1.5
    assert at["speedup"] == pytest.approx(reach * 2.0 / at["time_s"])
    short = rows["warm_short"]["rates"]["1gbit"]
    assert short["time_s"] is None and "too short for 10 dense steps" in short["source"]


def test_pytorchs_powersgd_hook_prices_its_fp32_start_at_the_dense_step(tmp_path: Path) -> None:
    """DDP's PowerSGD hook all-reduces fp32 for its first 10 steps (``dense_start`` in the cluster run's meta):
    those steps cost its dense step, not its compressed one (which alone priced them before)."""
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "ddp_powersgd": {"loss": DENSE, "time": 0.1, "bytes": [1000.0] * 10 + [10.0] * (len(DENSE) - 10),
                         "gravac": None, "family": "baseline"}})
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "ddp_powersgd": {"loss": DENSE[:20], "time": [2.0] * 10 + [0.5] * 10, "bytes": [1000.0] * 10 + [10.0] * 10,
                         "gravac": None, "family": "baseline", "dense_start": 10}})
    row = next(r for r in build(loop, {"1gbit": cluster})["systems"] if r["id"] == "ddp_powersgd")
    at = row["rates"]["1gbit"]
    assert at["step_s"] == 0.5 and at["dense_start_step_s"] == 2.0
    assert at["time_s"] == pytest.approx(10 * 2.0 + (row["steps_to_target"] - 10) * 0.5)


def test_a_cluster_run_of_the_same_section_under_another_id_gives_the_time(tmp_path: Path) -> None:
    loop, cluster = loop_and_cluster(tmp_path, "mlp_recommended")
    row = next(r for r in build(loop, {"1gbit": cluster})["systems"] if r["id"] == "mlp_recommended")
    assert row["rates"]["1gbit"]["step_s"] == 0.5 and row["rates"]["1gbit"]["speedup"] == pytest.approx(4.0)


def test_a_noise_control_is_its_own_system_timed_by_the_cluster_run_of_the_system_it_perturbs(
        tmp_path: Path) -> None:
    """`gv_topk_100@jitter=1e-6` trains the same section as `gv_topk_100`, perturbed: matched to neither its base's
    loopback row nor merged with it, but stepped as its base on the cluster (no cluster runs a jitter)."""
    from ds_gravac_bench.fidelity_runs import match_key

    assert match_key("gv_topk_100@jitter=1e-6", STATIC) == match_key("gv_topk_100", STATIC) + "@jitter=1e-6"
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC},
        "gv_topk_100@jitter=1e-6": {"loss": SLOW, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE[:20], "time": 0.5, "bytes": 10.0, "gravac": STATIC}})
    rows = {r["id"]: r for r in build(loop, {"1gbit": cluster})["systems"]}
    control, base = rows["gv_topk_100@jitter=1e-6"], rows["gv_topk_100"]
    assert control["section_hash"] != base["section_hash"]
    assert control["rates"]["1gbit"]["step_s"] == 0.5
    assert control["steps_to_target"] is None and base["steps_to_target"] is not None     # its own curve


def test_every_builtin_compressor_has_its_family() -> None:
    """The report's family of each built-in compressor, against a table written from the papers' taxonomy."""
    from ds_gravac.compress.registry import BUILTINS, lookup
    from ds_gravac_bench.fidelity import compressor_family

    families = {"low-rank": {"powersgd", "acpsgd"},
                "quantization": {"fp16", "bf16", "onebit", "signsgd", "efsignsgd", "terngrad", "ternary", "qsgd",
                                 "tbq"}}
    for name in BUILTINS:
        want = next((f for f, names in families.items() if name in names), "sparsification")
        assert compressor_family(lookup(name)) == want, name


def test_a_second_dense_row_is_a_control_judged_on_accuracy_only(tmp_path: Path) -> None:
    """ds_dense_jitter (dense plus a 1e-6 perturbation) is not the reference: its gap is reported and judged on the
    loss bound, never on bytes (it sends dense's)."""
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None, "eval": {"eval/top1": 0.9}},
        "ds_dense_jitter": {"loss": SLOW, "time": 0.1, "bytes": 1000.0, "gravac": None, "eval": {"eval/top1": 0.9}},
        "twin": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None, "eval": {"eval/top1": 0.9}}})
    rows = {r["id"]: r for r in build(loop, {})["systems"]}
    gap = smooth(SLOW)[-1] / smooth(DENSE)[-1] - 1
    assert rows["ds_dense"]["verdict"] == "reference"
    assert rows["ds_dense_jitter"]["family"] == "dense"
    assert rows["ds_dense_jitter"]["verdict"] == f"control: loss +{100 * gap:.0f}%"
    assert rows["twin"]["verdict"] == "control: ok"
