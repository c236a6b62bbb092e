"""``python -m ds_gravac_bench.micro --smoke`` runs in-process and writes a well-formed report (no timing checks)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac.compress.registry import registered_names
from ds_gravac_bench.micro import main

STAT_KEYS = {"median", "p10", "p90", "n"}
PHASES = ("t_stage", "t_norm", "t_compress", "t_round2", "t_decompress_n2", "t_decompress_n4", "t_residual")
SEARCH = [10, 20, 40, 160, 1000]
LOWRANK = ("powersgd", "acpsgd")
SMOKE_MATRIX_NUMEL = 250 * 240 + 64 * 3 * 7 * 7      # the smoke set's matrices; its 1-D tensors go dense


def _check_lowrank_memory(r: dict) -> None:
    """Low-rank: the error slot and the scratch of the matrices only; summed in place (no receive buffer)."""
    assert r["memory_bytes"] == 2 * 4 * SMOKE_MATRIX_NUMEL and r["recv_bytes"] == 0
    assert r["dense_classified"]["tensors"] == 3 and r["codec_send_bytes"] > 0 and not r["probes"]


def _is_stat(d: object) -> bool:
    return isinstance(d, dict) and set(d) == STAT_KEYS and d["p10"] <= d["median"] <= d["p90"]


def test_smoke_report(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    report = main(["--smoke", "--sets", "resnet101,lstm", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(report))
    assert set(data) == {"env", "config", "sets", "results", "naive_topk", "sampled_threshold", "multilevel",
                         "memory"}
    for key in ("torch", "deepspeed", "numpy", "python", "cpu_model", "cores", "git_commit", "torch_threads"):
        assert key in data["env"]
    assert data["env"]["torch_threads"] == 1 and data["config"]["smoke"] is True
    assert set(data["sets"]) == {"resnet101", "lstm"}
    for info in data["sets"].values():
        assert info["numel"] == 100_000 and _is_stat(info["t_pass"]) and _is_stat(info["t_pass_out"])
        assert info["grad_bytes"] == 400_000

    labels = {r["compressor"] for r in data["results"]}
    expected = {n for n in registered_names() if n not in ("none", "topk", "acpsgd")}
    assert expected | {"topk[auto]", "topk[topk]", "topk[kthvalue]", "topk[sort]", "acpsgd[P]", "acpsgd[Q]"} <= labels
    lowrank = {(r["compressor"], r["level"]) for r in data["results"] if r["name"] in ("powersgd", "acpsgd")}
    assert {(c, lv) for c in ("powersgd", "acpsgd[P]", "acpsgd[Q]") for lv in (1, 2, 4)} <= lowrank
    timed = [r for r in data["results"] if "t_compress" in r and "world_size" not in r]   # not micro_quantizers
    assert not [r for r in data["results"] if "error" in r]
    for r in timed:
        for key in ("t_stage", "t_compress", "t_decompress_n2", "t_decompress_n4", "t_residual"):
            assert _is_stat(r[key]) and r["passes"][key] >= 0 and r["passes_out"][key] >= 0
        assert r["payload_bytes"] > 0 and r["gbps_compress"] > 0 and r["wire_cf"] > 1
        assert 0 <= r["real_entries"] <= r["values_sent"]
        assert set(r["passes"]) == set(PHASES) and r["buckets"] > 1      # the smoke plan has several buckets
        assert _is_stat(r["t_leave_memory"]) and _is_stat(r["t_commit_memory"])
        assert (r["t_round2"]["median"] > 0) == (r["name"] == "powersgd")     # only two-round patterns
    cf_rows = [r for r in timed if r["name"] not in LOWRANK]
    for key in ("naive_topk", "sampled_threshold"):
        assert {(r["set"], r["level"]) for r in data[key]} == {(s, c) for s in data["sets"] for c in (10, 100, 1000)}
        assert all(_is_stat(r["t"]) and r["passes_out"] > 0 for r in data[key])
    multi = {(r["set"], r["compressor"]) for r in data["multilevel"]}
    assert ("resnet101", "topk[auto]") in multi and ("lstm", "randomk") in multi
    for r in data["multilevel"]:
        assert r["levels"] == [10, 100, 1000] and r["ratio"] > 0 and set(r["pairs"]) == {"10+100", "10+1000"}

    # extra memory: per timed compressor, N = 2 and 8, each sent level alone and the 5-level search at 10
    assert not [r for r in data["memory"] if "error" in r]
    mem = {(r["set"], r["compressor"], r["world_size"], r["send_level"], tuple(r["probes"])): r
           for r in data["memory"]}
    for r in timed:
        for n in (2, 8):
            assert (r["set"], r["compressor"], n, r["level"], ()) in mem
            if r["name"] not in LOWRANK:      # levels are ranks there: no CF search
                assert (r["set"], r["compressor"], n, 10, tuple(SEARCH)) in mem
    assert cf_rows
    for r in data["memory"]:
        if r["name"] in LOWRANK:
            _check_lowrank_memory(r)
            continue
        x, g = r["x"], r["grad_bytes"]
        assert g == 400_000 and r["target_x"] == 2
        assert r["extra_bytes"] == r["memory_bytes"] + r["codec_send_bytes"] + r["codec_probe_bytes"] + r["recv_bytes"]
        assert x["total"] == pytest.approx(x["memory"] + x["codec"] + x["recv"])
        assert x["total"] == pytest.approx(r["extra_bytes"] / g) and r["within_target"] == (x["total"] <= 2)
        assert r["memory_bytes"] == sum(r["memory_slot_bytes"].values()) + r["memory_scratch_bytes"]
        assert r["x_incl_uncounted"] >= x["total"] and r["fallback_buckets"] == 0
        assert r["dense_classified"] == {"tensors": 0, "buckets": 0, "numel": 0, "flatten_transient_bytes": 0,
                                         "extra_bytes": 0}
        assert (r["codec_probe_bytes"] > 0) == bool(r["probes"])
        name = r["name"]
        # every tensor is compressible here: the memory is exactly its slots plus the scratch, in gradient copies
        assert x["memory"] == {"dgc": 3.0, "ef21": 3.0}.get(name, 2.0), r
        if name == "randomk":        # all-reduce: reduced in the send buffer, no receive buffer
            assert r["recv_bytes"] == 0
        else:                        # all-gather: N rows of the sent payload
            assert r["recv_bytes"] == r["world_size"] * r["codec_send_bytes"] and r["uncounted"]["bulk_index_bytes"] > 0
    topk = {(n, lv, p): mem[("resnet101", "topk[auto]", n, lv, p)] for n in (2, 8) for lv in (10, 100, 1000)
            for p in ((), tuple(SEARCH)) if ("resnet101", "topk[auto]", n, lv, p) in mem}
    assert topk[(8, 10, ())]["recv_bytes"] == 4 * topk[(2, 10, ())]["recv_bytes"]
    assert topk[(2, 10, ())]["x"]["codec"] == pytest.approx(0.2, rel=1e-3)   # (idx, val) per kept entry at 10x
    assert topk[(2, 10, tuple(SEARCH))]["x"]["codec"] > topk[(2, 10, ())]["x"]["codec"]
    assert topk[(2, 1000, ())]["x"]["total"] < topk[(2, 100, ())]["x"]["total"] < topk[(2, 10, ())]["x"]["total"]


def test_smoke_dense_classified(tmp_path: Path) -> None:
    """Tensors below ``min_compress_numel`` are dense-classified: reported, not counted as extra memory."""
    report = main(["--smoke", "--sets", "resnet101", "--compressors", "topk", "--topk-algorithms", "auto",
                   "--cfs", "100", "--min-compress-numel", "5000"])
    rows = report["memory"]
    assert {(r["world_size"], tuple(r["probes"])) for r in rows} == {(2, ()), (8, ()), (2, tuple(SEARCH)),
                                                                     (8, tuple(SEARCH))}
    for r in rows:
        dense = r["dense_classified"]
        assert dense["tensors"] == 1 and dense["numel"] == 1000 and dense["flatten_transient_bytes"] == 4000
        assert dense["extra_bytes"] == 0
        assert r["memory_bytes"] == 2 * 4 * 99_000 and r["x"]["memory"] == pytest.approx(2 * 99_000 / 100_000)
    (res,) = report["results"]
    assert res["tensors"] == 4 and res["compressed_numel"] == 99_000
