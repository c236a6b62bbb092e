"""``mode: "auto"`` over QSGD on real gloo ranks and DeepSpeed engines: no bucket mixes layer groups, each bucket is
sent at its group's level (dense, 8, 4 or 2 bits), the agreed per-group variance of every level equals an
independent float64 reference computed from both ranks' gradients, both ranks apply rank 0's codes, and a
checkpoint resume continues exactly as the uninterrupted run.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import models as M
from auto_watch import (check_bucket_levels, check_poisoned, check_resume, engine_of, group_of, poisoned_step,
                        records, watch)
from harness import run_ranks

# a nominal 10 Mbit/s link (plans independent of this machine's timing), 128-wide layers each in buckets of their
# own partitions' worth of blocks (64 blocks of 128 per partition: the variance is taken on every block, exactly);
# dense steps in fp32 ("engine"), so that their signals equal a float64 reference (bf16: test_auto_dense_dtype.py)
AUTO = {"mode": "auto", "compressor": "qsgd", "bucket_cap_mb": 0.0625, "min_compress_numel": 0,
        "agreement_check_interval": 1,
        "auto": {"warmup_steps": 0, "interval_steps": 3,
                 "dwell": 1, "pin_below_numel": 0, "link": "nominal", "link_gbit_s": 0.01,
                 "detector_eta": None, "efficiency_floor": 0.5,
                 "dense_dtype": "engine"}}
# the link and QSGD's codec timed at attach on both ranks (agreed fits); 5 repeats, so one preempted sample on a
# loaded machine does not flatten a codec line to slope 0 (seen once in CI beside a long benchmark run)
MEASURED = {**AUTO, "auto": {**AUTO["auto"], "link": "measure", "remeasure_decisions": 0, "refit_tolerance": None},
            "cost_model": {"probe_repeats": 5}}
STEPS, SAVE, PROBE = 12, 7, 1          # PROBE: a dense step (before the first decision)
DECISIONS = (2, 5, 8, 11)


def _engine(world: int, section: dict = AUTO) -> Any:
    return engine_of(section, world, width=128)


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    straight = _engine(world)
    seen = watch(straight, PROBE, lambda s: (s.energy, s.applied, s.variance))
    M.train(straight, rank, STEPS)
    handle = ds_gravac.get_handle(straight)
    groups = [(g.name, list(g.members), [(lv.family, lv.value) for lv in g.ladder]) for g in handle.controller.groups]
    buckets = [(b.compressible, [m.name for m in b.members]) for b in handle.sync.plan.buckets]
    sizes = {m.name: m.numel for m in handle.sync.members}
    first = _engine(world)
    M.train(first, rank, SAVE)
    ds_gravac.get_handle(first).save_checkpoint(save_dir, tag="auto")
    saved = ds_gravac.get_handle(first).controller.state_dict()
    resumed = _engine(world)
    ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="auto")
    loaded = ds_gravac.get_handle(resumed).controller.state_dict()
    M.train(resumed, rank, STEPS - SAVE, start=SAVE)
    resumed_records, resumed_params = records(resumed), M.params_of(resumed)
    poisoned = poisoned_step(resumed, rank, STEPS)
    measured = _engine(world, MEASURED)
    M.train(measured, rank, 4)
    ctl = ds_gravac.get_handle(measured).controller
    fits, pricer = ctl.ctx.cost_fits(), ctl._pricer()
    return {"measured_fits": {k: (fits.get(k).a, fits.get(k).b) for k in fits.names()},
            "priced_codec": {k: (v.a, v.b) for k, v in pricer.tables["qsgd"].fits.items() if "@" in k},
            "measured_records": records(measured),"records": records(straight), "params": M.params_of(straight), "groups": groups, "buckets": buckets, "sizes": sizes,
            "actions": seen["actions"], "signals": seen["signals"], "grads": seen["grads"],
            "saved": saved, "loaded": loaded, "resumed_records": resumed_records, "poisoned": poisoned,
            "resumed_params": resumed_params}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(_job, 2, str(tmp_path_factory.mktemp("auto_qsgd")))


def test_no_bucket_mixes_groups(results: list[dict]) -> None:
    res = results[0]
    owner = group_of(res)
    compressible = [names for ok, names in res["buckets"] if ok]
    assert compressible and all(len({owner[n] for n in names}) == 1 for names in compressible)
    assert results[1]["buckets"] == res["buckets"]


def test_ranks_apply_the_same_codes_and_params(results: list[dict]) -> None:
    r0, r1 = results
    assert len(r0["records"]) == STEPS and r0["records"] == r1["records"]
    assert r0["actions"] == r1["actions"] and r0["signals"] == r1["signals"]
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name


def test_each_bucket_is_sent_at_its_groups_level(results: list[dict]) -> None:
    """Level b bits ↔ QSGD at CF 32/b; dense (level 0) ↔ the bucket sent dense; every step, every bucket."""
    check_bucket_levels(results[0], lambda bits: 32.0 / bits)


def test_variance_signals_of_a_dense_step_match_a_float64_reference(results: list[dict]) -> None:
    """V_g(s) = N⁻² Σ_w Σ_partitions qsgd_variance(partition of x_w, s) with the codec's partitions of each bucket
    (the error model's own function, not the synchronizer's); S_g = ‖ḡ_g‖² (a dense step sends the exact mean)."""
    from ds_gravac.adapt.auto.error_model import qsgd_variance
    from ds_gravac.sync.server_memory import partition_size
    r0, r1 = results
    assert not any(c for c, _ in r0["actions"][PROBE])       # PROBE is a dense step
    owner = group_of(r0)
    count = len(r0["groups"])
    expected_v = [[0.0, 0.0, 0.0] for _ in range(count)]
    expected_s = [0.0] * count
    for compressible, members in r0["buckets"]:
        if not compressible:
            continue
        g = owner[members[0]]
        # a parameter without a gradient ("unused") is sent as zeros
        flats = [torch.cat([res["grads"][m].reshape(-1) if m in res["grads"]
                            else torch.zeros(r0["sizes"][m], dtype=torch.float64) for m in members])
                 for res in (r0, r1)]
        mean = (flats[0] + flats[1]) / 2
        expected_s[g] += float(mean.square().sum())
        size = partition_size(flats[0].numel(), 2)
        for j, s in enumerate((127, 7, 1)):
            for x in flats:
                for p in range(2):
                    part = x[p * size:(p + 1) * size]
                    if part.numel():
                        expected_v[g][j] += qsgd_variance(part, s, 128) / 4.0
    for g, (energy, applied, variance) in enumerate(r0["signals"][PROBE]):
        assert energy == pytest.approx(expected_s[g], rel=1e-5, abs=1e-12), r0["groups"][g][0]
        assert applied == energy
        assert variance == pytest.approx(expected_v[g], rel=1e-6, abs=1e-15), r0["groups"][g][0]
        assert variance[0] <= variance[1] <= variance[2]         # fewer bits, more variance


def test_tight_start_then_fewer_bits_within_the_budget(results: list[dict]) -> None:
    recs = {int(r["step"]): r for r in results[0]["records"]}
    levels = [k for k in recs[2] if k.startswith("auto/level/")]
    assert recs[2]["auto/tight"] == 1 and recs[5]["auto/tight"] == 0
    for s in DECISIONS:
        assert recs[s]["auto/error"] <= recs[s]["auto/budget"] * (1 + 1e-12), s
    # the quiet budget is at least the efficiency floor's S·(1/0.5 − 1) = S: below 8 bits somewhere, fewer bytes
    assert any(0.0 < recs[5][k] < 8.0 for k in levels)
    assert recs[5]["bytes_sent"] < recs[0]["bytes_sent"]
    for s in range(1, STEPS):
        if s not in DECISIONS:
            assert {k: recs[s][k] for k in levels} == {k: recs[s - 1][k] for k in levels}, s


def test_a_nonfinite_step_leaves_the_controller_untouched(results: list[dict]) -> None:
    for res in results:
        check_poisoned(res, STEPS)


def test_resume_restores_the_plan_and_matches(results: list[dict]) -> None:
    for res in results:
        assert res["loaded"] == res["saved"] and res["saved"]["decisions"] == 2
        check_resume(res)


def test_the_measured_link_and_codec_are_agreed_and_priced(results: list[dict]) -> None:
    """``auto.link: "measure"`` over QSGD times the all-reduce, the all-gather and QSGD's encode and decode at 8, 4
    and 2 bits; both ranks hold the same fits, and the plan prices QSGD's codec from them, not from the priors."""
    r0, r1 = results
    assert r0["measured_fits"] == r1["measured_fits"] and r0["measured_records"] == r1["measured_records"]
    names = set(r0["measured_fits"])
    codec = {f"{op}@{cf:g}" for op in ("encode", "decode") for cf in (4.0, 8.0, 16.0)}
    assert {"all_reduce", "all_gather", "all_to_all", "stage", "writeback", "gemm"} | codec <= names
    assert {k: v for k, v in r0["priced_codec"].items() if k in codec} == {k: r0["measured_fits"][k] for k in codec}
    assert all(r0["measured_fits"][k][1] > 0 for k in codec)
