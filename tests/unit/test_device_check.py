"""``python -m ds_gravac_bench.device_check --device cpu --tiny``: the device check runs on CPU (the device path
forced on CPU tensors), passes, and its report names every compressor and every field."""
from __future__ import annotations

import json

from ds_gravac.compress.registry import registered_names
from ds_gravac_bench import device_check


def test_device_check_cpu_tiny(tmp_path) -> None:
    out = tmp_path / "report.json"
    device_check.main(["--device", "cpu", "--tiny", "--out", str(out)])
    report = json.loads(out.read_text())
    assert set(report["compressors"]) == set(registered_names())
    for key in ("device", "torch", "copy_bandwidth_gb_s", "compressors", "dense_parity", "modes", "train_1rank",
                "passed", "fields"):
        assert key in report, key
    assert report["copy_bandwidth_gb_s"] > 0
    assert report["dense_parity"] == {**report["dense_parity"], "1rank": True, "2rank": True}
    for name, entry in report["compressors"].items():
        assert {"family", "codec", "throughput", "train_2rank"} <= set(entry), name
        assert entry["codec"]["passed"], (name, entry["codec"])
        assert {c["dtype"] for c in entry["codec"]["cases"]} == {"float32", "bfloat16"}
        assert entry["throughput"]["gb_per_s"] > 0 and entry["throughput"]["memory_passes"] > 0
        t = entry["train_2rank"]
        assert "error" not in t, (name, t)
        assert t["passed"] and t["finite"] and t["replicas_identical"], (name, t)
        assert {"syncs_per_step", "sync_budget", "cuda_syncs_per_step"} <= set(t)
        assert t["branch"] == "cand", name                           # really compressed on two ranks
    assert set(report["train_1rank"]) == {"dense", "cast", "sparsifier", "lowrank", "quantizer", "controller"}
    assert all(t["passed"] and "error" not in t for t in report["train_1rank"].values()), report["train_1rank"]
    assert set(report["modes"]) == {"dense", "gravac", "auto_powersgd", "auto_qsgd", "auto_topk"}
    assert all(m["passed"] for m in report["modes"].values())
    assert all(report["modes"][m]["branch"] != "dense" for m in ("gravac", "auto_powersgd", "auto_qsgd", "auto_topk"))
    assert report["passed"]
