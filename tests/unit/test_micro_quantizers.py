"""``ds_gravac_bench.micro`` rows of the quantizers and half casts (``micro_quantizers``): a smoke run on the tiny
synthetic set, checking rows, timings, the bytes against the payload layout worked out here by hand, and the
decoded aggregate's error (no timing thresholds: the machine is shared)."""
from __future__ import annotations

import math
import time

import pytest

from ds_gravac_bench.micro import SMOKE_SHAPES, main

QUANTIZERS = {"onebit": [32], "signsgd": [32], "efsignsgd": [32], "terngrad": [4, 8, 16, 32], "ternary": [16],
              "qsgd": [4, 8, 16], "tbq": [16]}
HALVES = ("fp16", "bf16")
NS = (2, 4)
SMOKE_NUMEL = sum(math.prod(s) for s in SMOKE_SHAPES)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def slice_words(name: str, level: float, L: int) -> int:
    """32-bit words of one partition payload of L elements: fp32 header words + packed codes."""
    bits = round(32 / level)
    if name in ("onebit", "efsignsgd"):          # scale s + one sign bit per element
        return 1 + cdiv(L, 32)
    if name == "signsgd":                        # sign bits only
        return cdiv(L, 32)
    if name == "terngrad":                       # [lo, hi] + b-bit codes
        return 2 + cdiv(L * bits, 32)
    if name == "ternary":                        # max-abs scale + 2-bit codes
        return 1 + cdiv(2 * L, 32)
    if name == "qsgd":                           # one norm per block of 128 + codes of width 32/θ
        return cdiv(L, 128) + cdiv(L * bits, 32)
    if name == "tbq":                            # 2-bit codes, τ is configuration
        return cdiv(2 * L, 32)
    raise AssertionError(name)


@pytest.fixture(scope="module")
def report() -> dict:
    t0 = time.perf_counter()
    rep = main(["--smoke", "--sets", "resnet101", "--cfs", "", "--world-sizes", "2,4",
                "--compressors", ",".join([*QUANTIZERS, *HALVES])])
    assert time.perf_counter() - t0 < 300       # a guard against a runaway smoke run, not a speed check
    return rep


def finite_stat(s: dict) -> bool:
    return all(math.isfinite(s[k]) and s[k] >= 0 for k in ("median", "p10", "p90"))


def test_every_quantizer_level_and_n_has_rows(report: dict) -> None:
    rows = report["results"]
    assert not [r for r in rows if "error" in r or "skipped" in r]
    assert report["config"]["world_sizes"] == [2, 4]
    got = {(r["name"], r["level"], r["world_size"], r["exchange"]) for r in rows}
    want = {(q, lv, n, ex) for q, levels in QUANTIZERS.items() for lv in levels for n in NS
            for ex in ("casync_ps", "allgather")}
    want |= {(h, 2, n, "half_allreduce") for h in HALVES for n in NS}
    assert got == want
    for r in rows:
        n = r["world_size"]
        keys = ["t_stage", "t_compress", "t_leave_memory", "t_encode", f"t_decompress_n{n}"]
        keys += ["t_merge"] if r["exchange"] == "casync_ps" else []
        assert all(finite_stat(r[k]) for k in keys), r
        assert ("t_merge" in r) == (r["exchange"] == "casync_ps")
        assert r["passes_encode"] == r["passes"]["t_encode"] and r["passes_decode"] == r["passes"][f"t_decompress_n{n}"]
        assert all(math.isfinite(v) and v >= 0 for v in r["passes"].values())
        assert r["within_3_passes"] == (max(r["passes"].values()) <= 3) == (not r["over_3_passes"])
        assert r["default_level"] == (r["level"] == {"terngrad": 16, "qsgd": 4}.get(r["name"], r["level"]))


def test_bytes_follow_the_payload_layout(report: dict) -> None:
    for r in report["results"]:
        n, nb = r["world_size"], r["bucket_numel"]
        assert sum(nb) == r["compressed_numel"] == SMOKE_NUMEL and r["buckets"] == len(nb) > 1
        dense = sum(2 * (n - 1) / n * 4 * m for m in nb)
        assert r["dense_bytes"] == pytest.approx(dense)
        if r["exchange"] == "half_allreduce":
            words = sum(cdiv(math.prod(s), 2) for s in SMOKE_SHAPES)      # two halves per word, per tensor
            assert r["payload_bytes"] == 4 * words
            assert r["bytes_sent"] == pytest.approx(2 * (n - 1) / n * 4 * words)
        else:
            Ls = [cdiv(m, n) for m in nb]
            assert r["partition_numel"] == Ls
            p = [slice_words(r["name"], r["level"], L) for L in Ls]
            assert r["payload_bytes"] == sum(4 * n * w for w in p)             # N slices per bucket
            sent = (sum(2 * (n - 1) * 4 * w for w in p) if r["exchange"] == "casync_ps"
                else sum((n - 1) * 4 * n * w for w in p))
            assert r["bytes_sent"] == pytest.approx(sent)
        assert r["bytes_vs_dense"] == pytest.approx(r["bytes_sent"] / dense)
        assert r["wire_cf"] == pytest.approx(4 * SMOKE_NUMEL / r["payload_bytes"])
    onebit = [r for r in report["results"] if r["name"] == "onebit" and r["exchange"] == "casync_ps"]
    assert all(0.031 < r["bytes_vs_dense"] < 0.032 for r in onebit)     # ≈ 1/32 of the dense ring all-reduce
    ag8 = {r["world_size"]: r["bytes_vs_dense"] for r in report["results"]
           if r["name"] == "terngrad" and r["level"] == 4 and r["exchange"] == "allgather"}
    assert ag8[4] == pytest.approx(2 * ag8[2], rel=1e-3)      # gathering: N/2 · 1/CF of dense, PS: 1/CF
    assert all(r["pays"] == (r["bytes_vs_dense"] < 1) for r in report["results"])   # nothing here falls back


def test_decoded_aggregate_is_close_to_the_mean(report: dict) -> None:
    for r in report["results"]:
        err, cos = r["rel_err"], r["cosine"]
        assert math.isfinite(err) and -1 <= cos <= 1, r
        if r["name"] == "fp16":
            assert err < 1e-3
        elif r["name"] == "bf16":
            assert err < 1e-2
        elif r["name"] == "signsgd":      # ±1 whatever the gradient's scale: only the direction is comparable
            assert cos > 0.1
        else:
            assert err < 20 and cos >= 0, r
    best = {(r["name"], r["exchange"]): r["rel_err"] for r in report["results"]
            if r["level"] == 4 and r["world_size"] == 2}
    assert best[("terngrad", "casync_ps")] < 0.1 and best[("qsgd", "casync_ps")] < 0.1     # 8-bit codes
