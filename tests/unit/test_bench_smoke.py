"""``python -m ds_gravac_bench.micro --smoke`` runs in-process and writes a well-formed report (no timing checks)."""
from __future__ import annotations

import json
from pathlib import Path

from ds_gravac.compress.registry import registered_names
from ds_gravac_bench.micro import main

STAT_KEYS = {"median", "p10", "p90", "n"}


def _is_stat(d: object) -> bool:
    return isinstance(d, dict) and set(d) == STAT_KEYS and d["p10"] <= d["median"] <= d["p90"]


def test_smoke_report(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    report = main(["--smoke", "--sets", "resnet101,lstm", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report))
    assert set(data) == {"env", "config", "sets", "results", "naive_topk", "sampled_threshold", "multilevel"}
    for key in ("torch", "deepspeed", "numpy", "python", "cpu_model", "cores", "git_commit", "torch_threads"):
        assert key in data["env"]
    assert data["env"]["torch_threads"] == 1 and data["config"]["smoke"] is True
    assert set(data["sets"]) == {"resnet101", "lstm"}
    for info in data["sets"].values():
        assert info["numel"] == 100_000 and _is_stat(info["t_pass"]) and _is_stat(info["t_pass_out"])

    labels = {r["compressor"] for r in data["results"]}
    expected = {n for n in registered_names() if n not in ("none", "topk")}
    assert expected | {"topk[auto]", "topk[topk]", "topk[kthvalue]", "topk[sort]"} <= labels
    timed = [r for r in data["results"] if "t_compress" in r]
    assert not [r for r in data["results"] if "error" in r]
    for r in timed:
        for key in ("t_stage", "t_compress", "t_decompress_n2", "t_decompress_n4", "t_residual"):
            assert _is_stat(r[key]) and r["passes"][key] >= 0 and r["passes_out"][key] >= 0
        assert r["payload_bytes"] > 0 and r["gbps_compress"] > 0 and r["wire_cf"] > 1
        assert 0 <= r["real_entries"] <= r["values_sent"]
    for key in ("naive_topk", "sampled_threshold"):
        assert {(r["set"], r["level"]) for r in data[key]} == {(s, c) for s in data["sets"] for c in (10, 100, 1000)}
        assert all(_is_stat(r["t"]) and r["passes_out"] > 0 for r in data[key])
    multi = {(r["set"], r["compressor"]) for r in data["multilevel"]}
    assert ("resnet101", "topk[auto]") in multi and ("lstm", "randomk") in multi
    for r in data["multilevel"]:
        assert r["levels"] == [10, 100, 1000] and r["ratio"] > 0 and set(r["pairs"]) == {"10+100", "10+1000"}
