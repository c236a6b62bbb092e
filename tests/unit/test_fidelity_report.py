"""The fidelity report's arithmetic on hand-made step files: target, steps to target, time at a rate (loopback steps
× cluster step for static rows, the cluster run itself for GraVAC rows), speed-ups and the accuracy bounds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity import build, report
from ds_gravac_bench.fidelity_output import markdown
from ds_gravac_bench.report import smooth
from ds_gravac_bench.systems import config_system, resolve_system, system_matrix


def _write_run(root: Path, model: str, systems: dict[str, dict], **meta_extra: object) -> Path:
    """A bench_e2e-shaped directory: meta.json, configs/<id>.json, systems/<id>/steps.jsonl. A system may give
    ``evals`` (step → eval metrics), a declared ``family`` and a ``returncode`` (then ``log`` is its log.txt);
    ``time`` and ``bytes`` are one value for every step or a list of per-step values."""
    (root / "configs").mkdir(parents=True)
    meta = {"model": model, "steps": max(len(s["loss"]) for s in systems.values()), "env": {}, "systems": {},
            **meta_extra}
    for sid, s in systems.items():
        meta["systems"][sid] = {"returncode": s.get("returncode", 0), "family": s.get("family"),
                                **({"dense_start": s["dense_start"]} if "dense_start" in s else {})}
        if s.get("gravac") is not None:
            (root / "configs" / f"{sid}.json").write_text(json.dumps({"gravac": s["gravac"]}))
        d = root / "systems" / sid
        d.mkdir(parents=True)
        recs = [{"step": i + 1, "loss": loss, "time/step": s["time"][i] if isinstance(s["time"], list) else s["time"],
                 "bytes_sent": s["bytes"][i] if isinstance(s["bytes"], list) else s["bytes"]}
                for i, loss in enumerate(s["loss"])]
        if s.get("eval"):
            recs[-1].update(s["eval"])
        for step, metrics in s.get("evals", {}).items():
            recs[step - 1].update(metrics)
        d.joinpath("steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        if "log" in s:
            d.joinpath("log.txt").write_text(s["log"])
    (root / "meta.json").write_text(json.dumps(meta))
    return root


DENSE = [3.0 - 0.02 * i for i in range(100)]          # falls linearly: 3.0 → 1.02
SLOW = [3.0 - 0.01 * i for i in range(100)]           # half the progress per step
STATIC = {"mode": "static", "compressor": "topk", "cf": 100}
GRAVAC = {"mode": "gravac", "compressor": "topk"}


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None, "eval": {"eval/top1": 0.9}},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC, "eval": {"eval/top1": 0.89}},
        "gv_slow": {"loss": SLOW, "time": 0.1, "bytes": 10.0, "gravac": STATIC, "eval": {"eval/top1": 0.5}},
        "gv_gravac": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": GRAVAC},
    })
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE[:20], "time": 0.5, "bytes": 10.0, "gravac": STATIC},
        # its own cluster run learns on a different trajectory (link-dependent decisions): time from that run
        "gv_gravac": {"loss": SLOW, "time": [0.25] * 100, "bytes": 10.0, "gravac": GRAVAC},
    })
    return loop, cluster


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

    from ds_gravac_bench.fidelity import cluster_arg, clusters_of

    a = _write_run(tmp_path / "a", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1.0, "gravac": None}})
    b = _write_run(tmp_path / "b", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1.0, "gravac": None}})
    assert clusters_of([cluster_arg(f"1gbit={a},{b}"), cluster_arg(f"1gbit={a}")]) == {"1gbit": [a, b, a]}
    with pytest.raises(argparse.ArgumentTypeError, match="no meta.json"):
        cluster_arg(f"1gbit={a},{tmp_path}")
    with pytest.raises(argparse.ArgumentTypeError, match="RATE=DIR"):
        cluster_arg(str(a))


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
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "mlp_recommended": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE[:20], "time": 0.5, "bytes": 10.0, "gravac": STATIC}})
    row = next(r for r in build(loop, {"1gbit": cluster})["systems"] if r["id"] == "mlp_recommended")
    assert row["rates"]["1gbit"]["step_s"] == 0.5 and row["rates"]["1gbit"]["speedup"] == pytest.approx(4.0)


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


def _top1_curve(steps_to: dict[int, float]) -> dict[int, dict[str, float]]:
    return {step: {"eval/top1": top1} for step, top1 in steps_to.items()}


def test_the_task_sets_the_target_fraction_and_the_held_out_target(tmp_path: Path) -> None:
    """The long tasks judge on dense's smoothed loss at 90% of the budget and on dense's final held-out top-1 minus
    0.5 point, read on the evaluations every few steps; the jitter control's figures are the noise floor."""
    dense_top1 = {20: 0.30, 40: 0.50, 60: 0.70, 80: 0.75, 100: 0.80}
    loop = _write_run(tmp_path / "loop", "resnet18", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "evals": _top1_curve(dense_top1)},
        "ds_dense_jitter": {"loss": DENSE, "time": 0.1, "bytes": 1000.0,
                            "evals": _top1_curve({20: 0.3, 40: 0.5, 60: 0.7, 80: 0.796, 100: 0.797})},
        "late": {"loss": SLOW, "time": 0.1, "bytes": 10.0, "gravac": STATIC,
                 "evals": _top1_curve({20: 0.2, 40: 0.4, 60: 0.6, 80: 0.7, 100: 0.7955})},
        "ddp_bf16": {"loss": DENSE, "time": 0.1, "bytes": 500.0, "family": "baseline",
                     "evals": _top1_curve({20: 0.3, 40: 0.5, 60: 0.7, 80: 0.8, 100: 0.8})}},
        fidelity={"task": "x", "target_fraction": 0.9, "top1_margin": 0.005})
    cluster = _write_run(tmp_path / "c", "resnet18", {
        "ds_dense": {"loss": DENSE[:10], "time": 2.0, "bytes": 1000.0},
        "late": {"loss": DENSE[:10], "time": 0.5, "bytes": 10.0, "gravac": STATIC},
        "ddp_bf16": {"loss": DENSE[:10], "time": 1.0, "bytes": 500.0, "family": "baseline"}})
    res = build(loop, {"1gbit": cluster})
    assert res["target_fraction"] == 0.9 and res["target_loss"] == pytest.approx(smooth(DENSE)[89])
    assert res["top1_target"] == pytest.approx(0.795)
    rows = {r["id"]: r for r in res["systems"]}
    assert rows["ds_dense"]["steps_to_top1"] == 100 and rows["late"]["steps_to_top1"] == 100
    assert rows["ddp_bf16"]["steps_to_top1"] == 80 and rows["ds_dense_jitter"]["steps_to_top1"] == 80
    t = rows["ddp_bf16"]["rates"]["1gbit"]
    assert t["top1_time_s"] == pytest.approx(80 * 1.0) and t["top1_speedup"] == pytest.approx(200 / 80)
    assert rows["late"]["rates"]["1gbit"]["top1_speedup"] == pytest.approx(200 / 50)
    assert rows["ddp_bf16"]["family"] == "baseline" and rows["ddp_bf16"]["verdict"] == "baseline: ok"
    assert res["noise_floor"]["top1_diff"] == pytest.approx(-0.003) and res["noise_floor"]["gap"] == 0.0
    md = markdown(res)
    assert "held-out top-1 79.50%" in md and "Noise floor (ds_dense_jitter" in md and "top-1 -0.30 points" in md
    assert "| ddp_bf16 | baseline |" in md and "| 80 (2.50) |" in md


def test_a_failed_system_is_listed_with_its_error(tmp_path: Path) -> None:
    loop = _write_run(tmp_path / "loop", "resnet18", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0},
        "ds_bf16": {"loss": DENSE[:3], "time": 0.1, "bytes": 500.0, "returncode": 1,
                    "log": "step 1\nRuntimeError: gloo does not support bfloat16\nexiting\n"}})
    res = build(loop, {})
    assert [r["id"] for r in res["systems"]] == ["ds_dense"]
    assert res["failures"] == [{"id": "ds_bf16", "returncode": 1,
                                "error": "RuntimeError: gloo does not support bfloat16"}]
    assert "| ds_bf16 | failed (exit 1): RuntimeError: gloo does not support bfloat16 |" in markdown(res)


def test_runs_made_apart_merge_only_with_the_same_settings(tmp_path: Path) -> None:
    """One long system per invocation: the jitter control's directory has no dense run to compare curves with, so
    its seed and runner options must match the dense directory's."""
    extra = ["--num-classes", "100", "--seed", "0"]
    dense = _write_run(tmp_path / "a", "resnet18", {"ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0}},
                       runner_extra=extra, lr=0.05)
    same = _write_run(tmp_path / "b", "resnet18", {"ds_dense_jitter": {"loss": SLOW, "time": 0.1, "bytes": 1000.0}},
                      runner_extra=extra, lr=0.05)
    assert {r["id"] for r in build([dense, same], {})["systems"]} == {"ds_dense", "ds_dense_jitter"}
    other = _write_run(tmp_path / "c", "resnet18", {"ds_dense_jitter": {"loss": SLOW, "time": 0.1, "bytes": 1000.0}},
                       runner_extra=extra[:-1] + ["1"], lr=0.05)
    with pytest.raises(SystemExit, match="ran with other runner_extra than .*--seed', '1'"):
        build([dense, other], {})


def test_reports_name_their_directories_without_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reports are kept and shared: a directory given by its absolute path is named relative to the working
    directory when it lies below it, else by its last component — never by the machine's absolute path."""
    from ds_gravac_bench.fidelity import report

    work = tmp_path / "work"
    loop = _write_run(work / "runs" / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    elsewhere = _write_run(tmp_path / "elsewhere" / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None}})
    monkeypatch.chdir(work)
    res = report([loop.resolve()], {"1gbit": [elsewhere.resolve()]}, work / "out")
    assert res["runs"] == ["runs/loop"] and res["clusters"] == {"1gbit": "c1g"}
    assert "runs/loop" in (work / "out" / "fidelity.json").read_text()
    for name in ("fidelity.json", "fidelity.md"):
        assert str(tmp_path) not in (work / "out" / name).read_text()


def test_a_gravac_row_whose_window_is_never_reached_is_labelled_static(dirs: tuple[Path, Path]) -> None:
    """100 steps never reach the default window's first boundary: the row learns as a static θ_min run and its
    label says so; rows of other modes keep their id."""
    loop, _ = dirs
    labels = {r["id"]: r["label"] for r in build(loop, {})["systems"]}
    assert labels["gv_gravac"].startswith("gv_gravac (window never reached: static")
    assert labels["gv_topk_100"] == "gv_topk_100" and labels["ds_dense"] == "ds_dense"


def test_a_controller_trained_only_on_the_cluster_gets_a_row_per_rate(tmp_path: Path) -> None:
    """auto and GraVAC decide from the measured link, so on the long tasks they train only on the cluster: each
    rate's run is a row of its own — loss, held-out top-1 and time all from that run — and a run of other settings
    (another budget here) is listed as not compared instead of being judged against this dense run."""
    auto = {"mode": "auto", "compressor": "powersgd"}
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None, "eval": {"eval/top1": 0.9}}})
    fast = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1000.0, "gravac": None},
        "gv_auto": {"loss": DENSE, "time": [3.0] * 10 + [0.5] * 90, "bytes": 10.0, "gravac": auto,
                    "eval": {"eval/top1": 0.9}}})
    slow = _write_run(tmp_path / "c100m", "mlp", {
        "gv_auto": {"loss": SLOW, "time": 0.2, "bytes": 10.0, "gravac": auto, "eval": {"eval/top1": 0.5}}})
    short = _write_run(tmp_path / "c10g", "mlp", {
        "gv_auto": {"loss": DENSE[:50], "time": 0.1, "bytes": 10.0, "gravac": auto}})
    clusters = {"1gbit": [fast], "100mbit": [slow], "10gbit": [short]}
    res = build(loop, clusters)
    rows = {r["id"]: r for r in res["systems"]}
    assert set(rows) == {"ds_dense", "gv_auto at 1gbit", "gv_auto at 100mbit"}
    reach = rows["ds_dense"]["steps_to_target"]
    at_1g, at_100m = rows["gv_auto at 1gbit"], rows["gv_auto at 100mbit"]
    assert at_1g["steps_to_target"] == reach and at_1g["eval"] == {"eval/top1": 0.9}
    assert at_1g["rates"]["1gbit"]["time_s"] == pytest.approx(3.0 * 10 + 0.5 * (reach - 10))
    assert at_1g["rates"]["1gbit"]["speedup"] == pytest.approx(reach / (30.0 + 0.5 * (reach - 10)))
    assert at_1g["rates"]["100mbit"]["time_s"] is None and at_1g["verdict"] == "ok"
    assert at_100m["steps_to_target"] is None and at_100m["final_loss"] == pytest.approx(smooth(SLOW)[-1])
    assert at_100m["verdict"].startswith("loss +") and "top-1" in at_100m["verdict"]
    assert at_1g["section_hash"].endswith("@1gbit") and at_1g["section_hash"] != at_100m["section_hash"]
    assert len(res["skipped"]) == 1 and res["skipped"][0].startswith("gv_auto at 10gbit (c10g): other steps")
    md = markdown(res)
    assert "| gv_auto at 10gbit | not compared:" in md and "gv_auto" in md
    report([loop], clusters, tmp_path / "report")                   # both plots draw the rows from their runs
    assert (tmp_path / "report" / "plots" / "loss_vs_time_100mbit.png").is_file()


def test_long_tasks_train_static_systems_on_loopback_and_controllers_on_the_cluster() -> None:
    """Each long task's loopback systems change no level over training, and what ``run --rate`` trains by default
    are controllers, judged by the same rule the report uses to time them by their own run."""
    from ds_gravac_bench.fidelity import TASKS
    from ds_gravac_bench.fidelity_time import adaptive

    for name in ("resnet18_long", "lstm_long"):
        task = TASKS[name]

        def section(sid: str) -> dict | None:
            return resolve_system(system_matrix(task.steps), sid).gravac

        assert not any(adaptive(section(s)) for s in task.systems), name
        assert task.controllers and all(adaptive(section(s)) for s in task.controllers), name
        assert "gv_auto" in task.controllers and "gv_accordion_topk" in task.controllers


def test_post_local_sgd_prices_its_averaging_steps_apart_from_its_local_steps(tmp_path: Path) -> None:
    """Post-local SGD with period 4 sends on every fourth step and nothing between: its cluster run's median step
    is a local one (0.1 s), which would price the 4.1 s averages at 0.1 s. Each loopback step that sent is priced
    at the median sending step, each quiet one at the median quiet step; a cluster run without an average past the
    skipped steps cannot price it and says so. Kept reports price it the same way."""
    def periodic(n: int, send: float, quiet: float) -> list[float]:
        return [send if (i + 1) % 4 == 0 else quiet for i in range(n)]

    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "ddp_localsgd": {"loss": DENSE, "time": 0.1, "bytes": periodic(100, 1000.0, 0.0), "family": "baseline"}})
    cluster = _write_run(tmp_path / "c", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 4.0, "bytes": 1000.0, "gravac": None},
        "ddp_localsgd": {"loss": DENSE[:20], "time": periodic(20, 4.1, 0.1), "bytes": periodic(20, 1000.0, 0.0),
                         "family": "baseline"}})
    too_short = _write_run(tmp_path / "short", "mlp", {
        "ddp_localsgd": {"loss": DENSE[:3], "time": 0.1, "bytes": periodic(3, 1000.0, 0.0), "family": "baseline"}})
    res = build(loop, {"1gbit": cluster, "100mbit": too_short})
    row = {r["id"]: r for r in res["systems"]}["ddp_localsgd"]
    reach = row["steps_to_target"]
    sends = reach // 4
    t = row["rates"]["1gbit"]
    assert row["quiet_steps"] == {"all": 75, "steps": 100, "to_target": reach - sends, "to_top1": None}
    assert t["time_s"] == pytest.approx(sends * 4.1 + (reach - sends) * 0.1)
    assert t["step_s"] == pytest.approx((25 * 4.1 + 75 * 0.1) / 100)
    assert t["speedup"] == pytest.approx(reach * 4.0 / t["time_s"])
    assert row["rates"]["100mbit"]["time_s"] is None and "lacks a step that sends" in row["rates"]["100mbit"]["source"]
    from ds_gravac_bench.fidelity_seeds import combine
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "fidelity.json").write_text(json.dumps(build(loop, {})))
    again = {r["id"]: r for r in combine([[kept]], {"1gbit": [cluster]})["systems"]}["ddp_localsgd"]
    assert again["time_s"] == {"1gbit": pytest.approx(t["time_s"])}


def test_a_wander_of_the_first_steps_is_not_a_rising_loss(tmp_path: Path) -> None:
    """A language model starts at ln(10,000) = 9.2103 and, under warm-up, its first steps wander up by 2e-4 (the small
    LSTM's seed 0 on lstm_long): dense and its bitwise twin are not flagged; a 1.7% rise still is."""
    start = [9.2112, 9.2119, 9.2121, 9.2120, 9.2085] + [9.2 - 0.05 * i for i in range(95)]
    up = [9.2112] + [9.45] * 10 + start[11:]
    loop = _write_run(tmp_path / "loop", "lstm", {
        "ds_dense": {"loss": start, "time": 0.1, "bytes": 1000.0, "gravac": None},
        "wander": {"loss": start, "time": 0.1, "bytes": 10.0, "gravac": STATIC},
        "up": {"loss": up, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    rows = {r["id"]: r for r in build(loop, {})["systems"]}
    assert max(smooth(start)) > start[0] and not rows["wander"]["rises"] and rows["wander"]["verdict"] == "ok"
    assert rows["up"]["rises"] and "loss rises" in rows["up"]["verdict"]
