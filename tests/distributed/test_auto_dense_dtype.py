"""``auto.dense_dtype``: ``mode: "auto"`` all-reduces its dense rung in bf16 over an fp32 engine, bit for bit as
DeepSpeed does with ``"communication_data_type": "bf16"``; ``"engine"`` keeps DeepSpeed's fp32 path bit for bit;
a ``communication_data_type`` the user set is kept. ``dense_bytes`` stays what DeepSpeed would send in the run.

The plans stay dense: a nominal 10 Tbit/s link with no latency makes every compressed rung dearer than dense.
"""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

import models as M
from harness import run_ranks

STEPS = 6
FAST = {"mode": "auto", "compressor": "powersgd", "bucket_cap_mb": 0.05, "min_compress_numel": 0,
        "auto": {"warmup_steps": 0, "interval_steps": 2, "link": "nominal", "link_gbit_s": 10000.0, "link_alpha_s": 0.0,
                 "pin_below_numel": 0}}
# (case, gravac's auto section override, DeepSpeed's communication_data_type for both runs, the reference's)
CASES: tuple[tuple[str, dict, Optional[str], Optional[str]], ...] = (
    ("default", {}, None, "bf16"),                              # auto's bf16 over an fp32 engine
    ("engine", {"dense_dtype": "engine"}, None, None),          # DeepSpeed's fp32 path
    ("fp16", {"dense_dtype": "fp16"}, None, "fp16"),
    ("user_fp16", {}, "fp16", "fp16"),                          # the user's choice wins over auto's bf16
)


def _run(rank: int, world: int, gravac: Optional[dict], comm: Optional[str]) -> dict[str, Any]:
    import deepspeed

    import ds_gravac
    model = M.make_model(seed=0, width=128)
    extra = {"communication_data_type": comm} if comm else {}
    cfg = M.ds_config(gravac, world=world, lr=0.02, **extra)
    init = deepspeed.initialize if gravac is None else ds_gravac.initialize
    engine, *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
    M.train(engine, rank, STEPS)
    handle = ds_gravac.get_handle(engine)
    records = handle.pop_stats() if handle is not None else []
    keep = ("step", "branch", "bytes_sent", "dense_bytes")
    return {"params": M.params_of(engine), "numel": sum(p.numel() for p in model.parameters()),
            "records": [{k: v for k, v in r.items() if k in keep or k.startswith("auto/level/")} for r in records]}


def _job(rank: int, world: int) -> dict:
    out = {}
    for case, auto, comm, ref_comm in CASES:
        section = {**FAST, "auto": {**FAST["auto"], **auto}}
        out[case] = {"auto": _run(rank, world, section, comm), "deepspeed": _run(rank, world, None, ref_comm)}
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_job, 2)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_dense_rung_is_deepspeeds_path_in_its_dtype(results: list[dict], case: str) -> None:
    for res in results:
        got, ref = res[case]["auto"], res[case]["deepspeed"]
        assert len(got["records"]) == STEPS
        levels = [v for r in got["records"] for k, v in r.items() if k.startswith("auto/level/")]
        assert levels and all(v == 0.0 for v in levels), got["records"]     # the plan stayed dense
        for key, value in ref["params"].items():
            assert torch.equal(value, got["params"][key]), f"{case}: {key} differs from DeepSpeed"


@pytest.mark.parametrize("case, width", [("default", 2), ("engine", 4), ("fp16", 2), ("user_fp16", 2)])
def test_bytes_are_as_sent_and_dense_bytes_as_deepspeed_would(results: list[dict], case: str, width: int) -> None:
    """Sent: ring all-reduce of every value in ``width`` bytes. dense_bytes: DeepSpeed's own dtype in the run (fp32
    unless the user set ``communication_data_type``), so bf16 over an fp32 engine reads half of it."""
    engine_width = 2 if case == "user_fp16" else 4
    for res in results:
        got = res[case]["auto"]
        ring = 2.0 * (2 - 1) / 2 * got["numel"]
        assert all(r["bytes_sent"] == ring * width and r["dense_bytes"] == ring * engine_width
                   for r in got["records"]), got["records"]


def test_the_16_bit_runs_differ_from_fp32(results: list[dict]) -> None:
    """The comparison above is not vacuous: bf16 and fp32 dense end in different weights."""
    a, b = results[0]["default"]["auto"]["params"], results[0]["engine"]["auto"]["params"]
    assert any(not torch.equal(a[k], b[k]) for k in a)


# ---- a dense-rung group beside a compressed one: its own bucket, in bf16 ----------------------------------------
SCRIPTED = {**FAST, "auto": {**FAST["auto"], "dwell": 0, "min_gain": 0.0}}


def _mixed(rank: int, world: int, shared: bool = False) -> dict[str, Any]:
    """Rank 0's proposal scripted at step 2: the 128 × 128 group at rank 2, every other group dense (``shared``:
    ``auto.buckets: "shared"`` with 1 MB buckets, which hold every compressed tensor together)."""
    import ds_gravac
    model = M.make_model(seed=0, width=128)
    section = SCRIPTED if not shared else {**SCRIPTED, "bucket_cap_mb": 1.0,
                                           "auto": {**SCRIPTED["auto"], "buckets": "shared"}}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(section, world=world, lr=0.02))
    handle = ds_gravac.get_handle(engine)
    ctl = handle.controller

    def propose(step: int, lr: float) -> torch.Tensor:
        codes = [next(i for i, lv in enumerate(g.ladder) if lv.family == "lowrank" and lv.value == 2)
                 if g.name == "128x128" else 0 for g in ctl.groups]
        return torch.tensor(codes + [0], dtype=torch.int64)
    ctl.propose = propose
    M.train(engine, rank, 4)
    groups = {name: g for g in ctl.groups for name in g.members}
    buckets = [{groups[m.name].name for m in b.members if m.name in groups} for b in handle.sync.plan.buckets]
    compressed = sum(m.numel for b in handle.sync.plan.buckets if b.compressible for m in b.members)
    return {"records": [(r["step"], r["branch"], r["bytes_sent"]) for r in handle.pop_stats()], "buckets": buckets,
            "shapes": {n: tuple(p.shape) for n, p in model.named_parameters()}, "compressed": compressed,
            "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters())}


def test_a_dense_group_beside_a_compressed_one_is_its_own_bf16_bucket() -> None:
    """Sent at step 2 and 3: the 128 × 128 matrices' two rank-2 factors in fp32 (P: 128 × 2, Q: 128 × 2), every
    other value in bf16 (ring all-reduce at N = 2 sends its input once); no bucket holds two groups."""
    res = run_ranks(_mixed, 2)[0]
    assert all(len(names) <= 1 for names in res["buckets"]), res["buckets"]
    shapes = res["shapes"].values()
    k = sum(1 for s in shapes if s == (128, 128))
    numel = sum(int(torch.Size(s).numel()) for s in shapes)
    assert k >= 2
    expected = 2 * (numel - k * 128 * 128) + 4 * k * (128 * 2 + 128 * 2)
    steps = {s: (branch, sent) for s, branch, sent in res["records"]}
    assert steps[2] == steps[3] == ("cand", expected), (steps, expected)


def _shared(rank: int, world: int) -> dict[str, Any]:
    return _mixed(rank, world, shared=True)


def test_shared_buckets_carry_a_dense_group_plain_beside_a_compressed_one() -> None:
    """``auto.buckets: "shared"``: one bucket holds several groups; at steps 2 and 3 the 128 × 128 matrices send
    their rank-2 factors, the other compressed tensors their plain fp32 values in the same all-reduce, the
    uncompressed ones (vectors) bf16; the all-dense steps before are dense steps in bf16."""
    res = run_ranks(_shared, 2)[0]
    assert any(len(names) >= 2 for names in res["buckets"]), res["buckets"]
    shapes = res["shapes"].values()
    k = sum(1 for s in shapes if s == (128, 128))
    numel = sum(int(torch.Size(s).numel()) for s in shapes)
    plain = res["compressed"] - k * 128 * 128
    expected = 2 * (numel - res["compressed"]) + 4 * plain + 4 * k * (128 * 2 + 128 * 2)
    steps = {s: (branch, sent) for s, branch, sent in res["records"]}
    assert steps[0] == steps[1] == ("dense", 2 * numel), steps
    assert steps[2] == steps[3] == ("cand", expected), (steps, expected)
    assert res["finite"]
