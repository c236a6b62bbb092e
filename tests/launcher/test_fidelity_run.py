"""The fidelity benchmark end to end on loopback: the MLP task, 4 steps, DeepSpeed dense and a shipped config file,
through the real deepspeed launcher; the report compares them at equal steps."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.launcher
def test_fidelity_run_on_loopback(tmp_path: Path) -> None:
    from ds_gravac_bench.fidelity import main

    cfg = tmp_path / "mlp_lowrank.json"
    out = tmp_path / "out"
    section = {"mode": "static", "compressor": {"type": "powersgd", "params": {"rank": 16}},
               "min_compress_numel": 16384}
    cfg.write_text(json.dumps({**{k: v for k, v in json.loads((ROOT / "ds_configs" / "mlp_dense.json").read_text())
                                  .items() if k != "gravac"}, "gravac": section}))
    main(["run", "--task", "mlp", "--steps", "4", "--systems", f"ds_dense,cfg:{cfg}", "--out", str(out),
          "--seed", "3"])
    assert json.loads((out / "meta.json").read_text())["runner_extra"][-2:] == ["--seed", "3"]
    res = json.loads((out / "fidelity.json").read_text())
    rows = {r["id"]: r for r in res["systems"]}
    assert set(rows) == {"ds_dense", "mlp_lowrank"} and res["reference"] == "ds_dense"
    mine, dense = rows["mlp_lowrank"], rows["ds_dense"]
    assert mine["family"] == "low-rank" and mine["steps"] == dense["steps"] == 4
    assert 0 < mine["bytes_ratio"] < 0.5 and dense["bytes_ratio"] == 1.0
    steps = [json.loads(x) for x in (out / "systems" / "ds_dense" / "steps.jsonl").read_text().splitlines()]
    assert dense["final_loss"] != steps[-1]["loss"] or len(steps) == 1      # smoothed, not the raw last loss
    assert "| mlp_lowrank | low-rank |" in (out / "fidelity.md").read_text()
    assert (out / "plots" / "loss_vs_step.png").stat().st_size > 0
    assert json.loads((out / "configs" / "mlp_lowrank.json").read_text())["gravac"] == section
