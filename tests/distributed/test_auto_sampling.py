"""``auto.sample_steps``: over low rank, ``mode: "auto"`` runs the power iteration on a dense step's exact average
(which measures every ladder rank's captured energy) only on the K + 1 steps before each decision and on every step
before the first; the dense steps between skip it. Training is unchanged (the iteration only moves the warm start),
both ranks skip the same steps, and only the sampled steps report signals (the skipped ones none at all).

A nominal 10 Tbit/s link keeps every plan dense. Decisions at steps 2, 8, 14 (start 2, interval 6); K = 2 measures
the steps with 3 or fewer steps to the next decision: 5, 6, 7 and 11, 12, 13, and 0, 1 before the first.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import models as M
from harness import run_ranks

STEPS = 14
SECTION = {"mode": "auto", "compressor": "powersgd", "bucket_cap_mb": 0.05, "min_compress_numel": 0,
           "auto": {"warmup_steps": 0, "interval_steps": 6,
                    "sample_steps": 2, "link": "nominal", "link_gbit_s": 10000.0,
                    "link_alpha_s": 0.0, "pin_below_numel": 0, "detector_eta": None}}
EVERY = {**SECTION, "auto": {**SECTION["auto"], "sample_steps": 100}}
MEASURED = {0, 1, 5, 6, 7, 11, 12, 13}


def _run(rank: int, world: int, section: dict) -> dict[str, Any]:
    import ds_gravac
    model = M.make_model(seed=0, width=128)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(section, world=world, lr=0.02))
    handle = ds_gravac.get_handle(engine)
    ctl, comp = handle.controller, handle.sync.comp
    refreshed: dict[int, int] = {}
    refresh = comp.refresh

    def counted(ctx: Any, g: torch.Tensor, side: str) -> None:
        refreshed[int(engine.global_steps)] = refreshed.get(int(engine.global_steps), 0) + 1
        refresh(ctx, g, side)
    comp.refresh = counted
    signals: dict[int, list] = {}
    observe = ctl.observe

    def watched(stats: Any) -> None:
        if stats.aggregate is not None:
            signals[stats.aggregate.step] = [s.prefix for s in stats.aggregate.groups]
        observe(stats)
    ctl.observe = watched
    M.train(engine, rank, STEPS)
    records = handle.pop_stats()
    return {"params": M.params_of(engine), "refreshed": refreshed, "signals": signals,
            "branches": [r["branch"] for r in records], "matrices": sum(1 for p in model.parameters() if p.dim() > 1)}


def _job(rank: int, world: int) -> dict:
    return {"sampled": _run(rank, world, SECTION), "every": _run(rank, world, EVERY)}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_job, 2)


def test_the_power_iteration_runs_on_the_sampled_steps_only(results: list[dict]) -> None:
    for res in results:
        sampled, every = res["sampled"], res["every"]
        assert set(sampled["branches"]) == {"dense"} and set(every["branches"]) == {"dense"}
        n = sampled["matrices"]
        assert n >= 3
        assert sampled["refreshed"] == {s: n for s in sorted(MEASURED)}, sampled["refreshed"]
        assert every["refreshed"] == {s: n for s in range(STEPS)}, every["refreshed"]


def test_only_sampled_steps_report_signals_and_they_report_every_rank(results: list[dict]) -> None:
    """A step not sampled carries no signal at all (as a non-finite step); a sampled dense step measures ranks."""
    r0, r1 = (res["sampled"] for res in results)
    assert r0["signals"] == r1["signals"]
    # step i's signals arrive with step i + 1: the last step's are still in flight
    assert set(r0["signals"]) == MEASURED - {STEPS - 1}, sorted(r0["signals"])
    for step, prefixes in r0["signals"].items():     # the power iteration ran: ranks up to each factor's width
        assert any(p is not None for group in prefixes for p in group), step
    every = results[0]["every"]["signals"]
    assert set(every) == set(range(STEPS - 1))


def test_training_is_unchanged_and_replicated(results: list[dict]) -> None:
    """The skipped iteration only moves the warm start of a compressed step to come: dense steps are equal."""
    for res in results:
        for key, value in res["every"]["params"].items():
            assert torch.equal(value, res["sampled"]["params"][key]), key
    for key, value in results[0]["sampled"]["params"].items():
        assert torch.equal(value, results[1]["sampled"]["params"][key]), key
