"""``mode: "auto"`` over PowerSGD on real gloo ranks and DeepSpeed engines: both ranks apply rank 0's codes every
step, the plan moves from the tight start (dense) to a compressed plan, a learning-rate drop tightens the next
decision, and a checkpoint resume restores the plan bitwise and continues exactly as the uninterrupted run.

One spawn of two ranks runs everything: an uninterrupted run of ``STEPS`` steps with the learning rate divided by
10 before step ``DROP``, and the same run saved after ``SAVE`` steps and resumed in a fresh engine.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import models as M
from harness import run_ranks

# a nominal 10 Mbit/s link, so that compressing the 128 × 128 layers pays on this tiny model
AUTO = {"mode": "auto", "compressor": "powersgd", "bucket_cap_mb": 0.05, "min_compress_numel": 0,
        "agreement_check_interval": 1,
        "auto": {"interval_steps": 4, "dwell": 1, "pin_below_numel": 0, "link_gbit_s": 0.01}}
STEPS, DROP, SAVE = 20, 12, 9
DECISIONS = (2, 6, 10, 14, 18)        # start 2 (the first signals), then every 4 steps


def _engine(world: int) -> Any:
    import ds_gravac
    model = M.make_model(seed=0, width=128)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(AUTO, world=world))
    return engine


def _train(engine: Any, rank: int, start: int, stop: int) -> None:
    """Steps [start, stop); the learning rate drops 10x before step DROP (a scheduler step on every rank)."""
    for s in range(start, stop):
        if s == DROP:
            for group in engine.optimizer.param_groups:
                group["lr"] *= 0.1
        M.train(engine, rank, 1, start=s)


def _records(engine: Any) -> list[dict]:
    import ds_gravac
    keep = ("step", "branch", "bytes_sent")
    return [{k: v for k, v in r.items() if k in keep or k.startswith("auto/")}
            for r in ds_gravac.get_handle(engine).pop_stats()]


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    straight = _engine(world)
    _train(straight, rank, 0, STEPS)
    first = _engine(world)
    _train(first, rank, 0, SAVE)
    handle = ds_gravac.get_handle(first)
    saved_state = handle.controller.state_dict()
    handle.save_checkpoint(save_dir, tag="auto")
    resumed = _engine(world)
    ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="auto")
    loaded_state = ds_gravac.get_handle(resumed).controller.state_dict()
    _train(resumed, rank, SAVE, STEPS)
    return {"params": M.params_of(straight), "records": _records(straight),
            "resumed_params": M.params_of(resumed), "resumed_records": _records(resumed),
            "saved_state": saved_state, "loaded_state": loaded_state,
            "groups": [g.name for g in ds_gravac.get_handle(straight).controller.groups]}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(_job, 2, str(tmp_path_factory.mktemp("auto_ckpt")))


def _by_step(records: list[dict]) -> dict[int, dict]:
    return {int(r["step"]): r for r in records}


def test_ranks_apply_the_same_codes_and_params(results: list[dict]) -> None:
    r0, r1 = results
    assert len(r0["records"]) == STEPS
    assert r0["records"] == r1["records"]         # codes, phase, predictions, bytes: every step, both ranks
    for name, value in r0["params"].items():
        assert torch.equal(value, r1["params"][name]), name


def test_tight_start_then_a_compressed_plan(results: list[dict]) -> None:
    recs = _by_step(results[0]["records"])
    hidden = "auto/level/128x128"
    assert hidden in recs[2]
    # the tight start (β 0.25 of rank 16's unsent energy) keeps the hidden layers dense ...
    assert recs[2]["auto/tight"] == 1 and recs[2][hidden] == 0.0 and recs[2]["branch"] == "dense"
    # ... the first quiet decision compresses them, and the step's bytes fall with it
    assert recs[6]["auto/tight"] == 0 and recs[6][hidden] > 0 and recs[6]["branch"] == "cand"
    assert recs[6]["bytes_sent"] < recs[2]["bytes_sent"]
    assert recs[6]["auto/error"] <= recs[6]["auto/budget"]
    for s in range(STEPS):          # codes change only at decision points
        if s not in DECISIONS and s > 0:
            assert {k: v for k, v in recs[s].items() if k.startswith("auto/level/")} == \
                {k: v for k, v in recs[s - 1].items() if k.startswith("auto/level/")}, s


def test_lr_drop_tightens_the_next_decision(results: list[dict]) -> None:
    recs = _by_step(results[0]["records"])
    before, after = recs[10], recs[14]          # the last decision before the drop (step 12), the first after
    assert before["auto/tight"] == 0 and after["auto/tight"] == 1
    # "denser" by error: the plan's predicted unsent energy relative to rank 16 everywhere, same signals' units
    assert after["auto/error_ratio"] <= before["auto/error_ratio"]
    assert after["auto/error"] <= after["auto/budget"]
    assert after["auto/budget"] == 0.25 * after["auto/reference_error"] > 0       # β tight, of rank 16's error
    assert before["auto/budget"] == before["auto/reference_error"] > 0             # β quiet
    assert recs[18]["auto/tight"] == 0          # quiet again one interval later


def test_resume_restores_the_plan_and_matches(results: list[dict]) -> None:
    for res in results:
        assert res["loaded_state"] == res["saved_state"]          # codes, dwell, phase, lr, signals: bitwise
        assert res["saved_state"]["decisions"] == 2 and any(res["saved_state"]["codes"])
        for name, value in res["params"].items():
            assert torch.equal(value, res["resumed_params"][name]), name
        straight = _by_step(res["records"])
        for rec in res["resumed_records"]:
            assert rec == straight[int(rec["step"])], rec["step"]
