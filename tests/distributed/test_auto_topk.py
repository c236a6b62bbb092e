"""``mode: "auto"`` over Top-k on real gloo ranks and DeepSpeed engines: no bucket mixes layer groups, each bucket is
sent at its group's CF (or dense), the agreed pooled unsent energy of every CF equals an independent float64
reference from both ranks' gradients (``error_model.sparse_unsent``; exact here: every coordinate is sampled and
every tensor is small), both ranks apply rank 0's codes, and a checkpoint resume continues exactly.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import models as M
from auto_watch import (check_bucket_levels, check_poisoned, check_resume, engine_of, group_of, poisoned_step,
                        records, watch)
from harness import run_ranks

# 16-wide layers: fewer compressible values than the signal's samples, so the estimate is exact; a nominal slow link
AUTO = {"mode": "auto", "compressor": "topk", "bucket_cap_mb": 0.002, "min_compress_numel": 0,
        "agreement_check_interval": 1,
        "auto": {"warmup_steps": 0, "interval_steps": 3,
                 "dwell": 1, "pin_below_numel": 0, "link": "nominal", "link_gbit_s": 0.001,
                 "detector_eta": None}}
STEPS, SAVE, PROBE = 12, 7, 1
DECISIONS = (2, 5, 8, 11)
CFS = (4.0, 10.0, 30.0, 100.0)


def _engine(world: int) -> Any:
    return engine_of(AUTO, world, width=16)


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    engine = _engine(world)
    handle = ds_gravac.get_handle(engine)
    ctl = handle.controller
    seen = watch(engine, PROBE, lambda s: (s.energy, s.unsent))
    M.train(engine, rank, STEPS)
    first = _engine(world)
    M.train(first, rank, SAVE)
    ds_gravac.get_handle(first).save_checkpoint(save_dir, tag="auto")
    resumed = _engine(world)
    ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="auto")
    M.train(resumed, rank, STEPS - SAVE, start=SAVE)
    resumed_records, resumed_params = records(resumed), M.params_of(resumed)
    poisoned = poisoned_step(resumed, rank, STEPS)
    return {"records": records(engine), "params": M.params_of(engine), "resumed_records": resumed_records, "poisoned": poisoned,
            "resumed_params": resumed_params, "actions": seen["actions"], "signals": seen["signals"],
            "grads": seen["grads"], "shapes": {m.name: tuple(m.param.shape) for m in handle.sync.members},
            "groups": [(g.name, list(g.members)) for g in ctl.groups],
            "buckets": [(b.compressible, [m.name for m in b.members]) for b in handle.sync.plan.buckets]}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(_job, 2, str(tmp_path_factory.mktemp("auto_topk")))


def test_ranks_agree_and_no_bucket_mixes_groups(results: list[dict]) -> None:
    r0, r1 = results
    assert len(r0["records"]) == STEPS and r0["records"] == r1["records"]
    assert r0["actions"] == r1["actions"] and r0["signals"] == r1["signals"]
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name
    owner = group_of(r0)
    assert all(len({owner[n] for n in names}) == 1 for ok, names in r0["buckets"] if ok)


def test_each_bucket_is_sent_at_its_groups_cf(results: list[dict]) -> None:
    check_bucket_levels(results[0], lambda cf: cf)
    recs = {int(r["step"]): r for r in results[0]["records"]}
    for s in DECISIONS:
        assert recs[s]["auto/error"] <= recs[s]["auto/budget"] * (1 + 1e-12), s


def test_unsent_energy_of_a_dense_step_matches_a_float64_reference(results: list[dict]) -> None:
    """Per group: Σ_members ‖N⁻¹ Σ_w (g_w − T_k(g_w))‖² at every CF, and ‖ḡ_g‖² (no residual before step PROBE)."""
    from ds_gravac.adapt.auto.error_model import sparse_unsent
    r0, r1 = results
    assert not any(c for c, _ in r0["actions"][PROBE])
    for g, (name, members) in enumerate(r0["groups"]):
        energy, unsent = 0.0, [0.0] * len(CFS)
        for m in members:
            xs = [res["grads"][m] if m in res["grads"] else torch.zeros(r0["shapes"][m], dtype=torch.float64)
                  for res in (r0, r1)]
            energy += float(((xs[0] + xs[1]) / 2).square().sum())
            unsent = [u + v for u, v in zip(unsent, sparse_unsent(xs, CFS))]
        got_energy, got_unsent = r0["signals"][PROBE][g]
        assert got_energy == pytest.approx(energy, rel=1e-9, abs=1e-15), name
        assert list(got_unsent) == pytest.approx(unsent, rel=1e-9, abs=1e-15), name
        assert list(got_unsent) == sorted(got_unsent)            # a higher CF leaves more behind


def test_a_nonfinite_step_leaves_the_controller_untouched(results: list[dict]) -> None:
    for res in results:
        check_poisoned(res, STEPS)


def test_resume_restores_the_plan_and_matches(results: list[dict]) -> None:
    for res in results:
        check_resume(res)


def test_heatmap_reads_cfs_least_compressed_first(results: list[dict], tmp_path) -> None:
    from runners.auto_heatmap import legend, level_grid, plot
    records = results[0]["records"]
    assert {r["auto/family_code"] for r in records} == {2}
    rungs = legend(records, level_grid(records)[2])
    assert rungs[0] == (0.0, "dense") and len(rungs) > 1
    assert [v for v, _ in rungs[1:]] == sorted(v for v, _ in rungs[1:])          # CF 4 before CF 100
    assert all(name == f"CF {v:g}" for v, name in rungs[1:])
    assert plot(records, tmp_path / "auto_levels.png").stat().st_size > 0
