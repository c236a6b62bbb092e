"""bench_e2e in smoke mode (127.0.0.1, tiny model, 3 steps, 2 systems): runs and writes a valid results.json."""
from __future__ import annotations

import glob
import json

import pytest


@pytest.mark.launcher
def test_bench_e2e_smoke(tmp_path) -> None:
    from ds_gravac_bench.e2e import main
    from ds_gravac_bench.report import validate
    main(["run", "--smoke", "--out", str(tmp_path)])
    ports = {sid: m["ports"] for sid, m in json.loads((tmp_path / "meta.json").read_text())["systems"].items()}
    assert len(ports["compute_only"]) == 2 and all(len(p) == 1 for sid, p in ports.items() if sid != "compute_only")
    left = [b for p in sum(ports.values(), []) for b in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{p}_*")]
    assert not left, f"the loopback runs left DeepSpeed's shm buffers behind: {sorted(left)}"
    results = json.loads((tmp_path / "results.json").read_text())
    validate(results)
    assert [s["id"] for s in results["systems"]] == ["compute_only", "ds_dense", "gv_topk_100"]
    assert all(s["steps"] == 3 for s in results["systems"])
    compute = results["systems"][0]
    assert compute["time_to_target_s"] is None, "the single-rank run's loss is not compared"
    for s in results["systems"]:
        assert s["bound"]["t_compute_measured"] and s["bound"]["t_compute"] == compute["step_time"]["median"]
    assert "Compute-only step T_compute" in (tmp_path / "results.md").read_text()
    rows = (tmp_path / "steps_loss_time.csv").read_text().splitlines()
    assert rows[0] == "system,step,loss,time_step,cf_sent" and len(rows) == 1 + 3 * 3
    first = {r.split(",")[0]: float(r.split(",")[2]) for r in reversed(rows[1:])}   # step 1 of each system
    assert first == {s["id"]: pytest.approx(s["loss"][0], rel=1e-5) for s in results["systems"]}
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "bytes_per_step.png", "cf_vs_step.png", "loss_vs_wall.png", "step_breakdown.png"]

