"""The baseline's step measured beside a controller's own cluster run: the run's options, the row that carries it,
and the leading table's ratio that uses it instead of the baseline's kept step."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity import build
from ds_gravac_bench.fidelity_lead import lead_markdown, ratios
from ds_gravac_bench.fidelity_reference import REFERENCE_DIR, needs_reference, reference_opts, reference_step
from ds_gravac_bench.fidelity_seeds import combine
from fidelity_report_cases import DENSE, _write_run

AUTO = {"mode": "auto", "compressor": "powersgd"}


def test_the_reference_run_differs_from_the_controllers_only_in_system_steps_and_directory(tmp_path: Path) -> None:
    e2e = argparse.Namespace(model="resnet18", rate="100mbit", ranks=2, steps=6000, systems="gv_auto", micro_batch=None,
                             lr=0.02, tag=3, timeout=300000.0, checkpoint_every=250, out=tmp_path / "c100m",
                             runner_extra=("--num-classes", "100", "--seed", "1"), fidelity={"task": "resnet18_long"})
    ref = vars(reference_opts(e2e, 70))
    assert {k: v for k, v in ref.items() if v != vars(e2e)[k]} == {
        "systems": "ddp_bf16", "steps": 70, "checkpoint_every": 0, "out": tmp_path / "c100m" / REFERENCE_DIR}
    assert vars(e2e)["systems"] == "gv_auto"        # the controllers' options are left as they were
    assert needs_reference("gv_auto,gv_gravac") and not needs_reference("gv_auto,ddp_bf16")


def test_an_invocation_that_trained_the_baseline_is_its_own_reference(tmp_path: Path) -> None:
    """A step-time table (all systems of a rate in one invocation) holds ddp_bf16 itself: its median step past the
    first two (0.6 s; over all six steps it would be 0.7 s) is the reference, and a reference run there would not be read."""
    both = _write_run(tmp_path / "steps", "mlp", {
        "ddp_bf16": {"loss": DENSE[:6], "time": [5.0, 5.0, 0.6, 0.6, 0.6, 0.8], "bytes": 500.0,
                     "family": "baseline"},
        "gv_auto": {"loss": DENSE[:6], "time": 0.3, "bytes": 10.0, "gravac": AUTO}})
    _write_run(both / REFERENCE_DIR, "mlp", {"ddp_bf16": {"loss": DENSE[:12], "time": 9.0, "bytes": 500.0}})
    assert reference_step(both) == {"system": "ddp_bf16", "step_s": 0.6}


def test_a_controller_row_is_divided_by_the_baseline_step_measured_beside_it(tmp_path: Path) -> None:
    """Dense and ddp_bf16 reach the loss target (dense's smoothed loss at 75% of 100 steps) at step 75 on loopback
    (the same curve). The step-time table kept for the rate says ddp_bf16 takes 1.0 s (75 s to target); the
    controller's own run at that rate reaches it in 75 × 0.4 = 30 s, and its invocation measured ddp_bf16 at 0.8 s
    beside it. Its ratio is 75 × 0.8 / 30 = 2.0, not 75 × 1.0 / 30 = 2.5."""
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0},
        "ddp_bf16": {"loss": DENSE, "time": 0.1, "bytes": 500.0, "family": "baseline"}})
    kept_steps = _write_run(tmp_path / "steps1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0},
        "ddp_bf16": {"loss": DENSE[:20], "time": 1.0, "bytes": 500.0, "family": "baseline"}})
    beside = _write_run(tmp_path / "auto1g", "mlp", {"gv_auto": {"loss": DENSE, "time": 0.4, "bytes": 10.0,
                                                                 "gravac": AUTO}})
    _write_run(beside / REFERENCE_DIR, "mlp", {
        "ddp_bf16": {"loss": DENSE[:12], "time": [3.0, 3.0] + [0.8] * 10, "bytes": 500.0, "family": "baseline"}})
    alone = _write_run(tmp_path / "auto100m", "mlp", {"gv_auto": {"loss": DENSE, "time": 0.25, "bytes": 10.0,
                                                                  "gravac": AUTO}})
    assert reference_step(beside) == {"system": "ddp_bf16", "step_s": 0.8} and reference_step(alone) is None

    res = build(loop, {"1gbit": [kept_steps, beside], "100mbit": [alone]})
    rows = {r["id"]: r for r in res["systems"]}
    reach = rows["ds_dense"]["steps_to_target"]
    assert reach == rows["ddp_bf16"]["steps_to_target"] == rows["gv_auto at 1gbit"]["steps_to_target"] == 75
    assert rows["gv_auto at 1gbit"]["rates"]["1gbit"]["reference"] == {"system": "ddp_bf16", "step_s": 0.8}
    assert rows["gv_auto at 100mbit"]["rates"]["100mbit"]["reference"] is None

    seed = tmp_path / "kept"
    seed.mkdir()
    (seed / "fidelity.json").write_text(json.dumps(res))
    combined = combine([[seed]])
    vs = ratios(combined)
    assert vs["gv_auto at 1gbit"]["1gbit"] == pytest.approx(75 * 0.8 / 30)
    assert vs["ddp_bf16"]["1gbit"] == pytest.approx(1.0)
    md = lead_markdown(combined)
    assert "| 30 s (2.00×; ddp_bf16 beside it 0.800 s) |" in md


def test_a_run_of_controllers_at_a_rate_ends_with_how_to_judge_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``fidelity run --rate`` trains controllers only: their directory holds no dense run, so instead of failing on
    a report it cannot make, it names the command that judges them against the seed's loopback run."""
    import ds_gravac_bench.fidelity as fidelity

    cluster = _write_run(tmp_path / "c1g", "mlp", {"gv_auto": {"loss": DENSE, "time": 0.4, "bytes": 10.0,
                                                               "gravac": AUTO}})
    monkeypatch.setattr(fidelity, "run", lambda opts, after_system=None: cluster)
    fidelity.main(["run", "--task", "mlp", "--rate", "1gbit"])
    assert "fidelity report <loopback dir> --cluster 1gbit=" in capsys.readouterr().out
    with_dense = _write_run(tmp_path / "steps", "mlp", {"ds_dense": {"loss": DENSE, "time": 1.0, "bytes": 1000.0}})
    monkeypatch.setattr(fidelity, "run", lambda opts, after_system=None: with_dense)
    fidelity.main(["run", "--task", "mlp", "--rate", "1gbit"])          # a step-time table with dense: its report
    assert (with_dense / "fidelity.md").is_file()
