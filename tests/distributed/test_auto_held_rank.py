"""``mode: "auto"`` held at one rank trains as static PowerSGD at that rank does (2 gloo ranks, DeepSpeed engines).

Under ``auto`` every matrix keeps factors 64 wide (the ladder's top rung) and a step at rank r reads their leading
r columns; its groups travel in buckets of their own, the steps before a decision measure every rank's captured
energy, a raise is re-projected on a plain step. None of that may change what a step at rank r applies: held at
one rank by its decisions, ``auto`` must follow the static run of that rank.

Measured when ResNet101 under ``auto`` lagged static rank 16 at ranks 32-64 (docs/algorithms.md §8): the held
plan is not the cause; the runs agree to float rounding (at rank 32 too, checked when this test was written; the
suite keeps rank 16, the reference level).

Both runs start from the same factor (the static one's ``r`` rows are the leading rows of ``auto``'s 64) and take
the same dense steps: ``auto``'s two before its first decision (a raise from an all-dense interval needs no
re-projection: those steps measured every rank), the static run's ``warmup_steps: 1`` plus its discovery step;
each dense step moves the warm start by one power iteration on the exact average. From step 2 on both send rank
r. The 512 × 512 layers pay at every ladder rank, so ``auto``'s factors are 64 wide. Batches of 64 a rank: with 8,
a layer's averaged gradient has rank ≤ 16, a rank-16 approximation of it is ill-conditioned, and float rounding
grew tenfold a step (1% apart after 8 steps, while rank 32 stayed at 1e-7).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import models as M
from harness import run_ranks

WIDTH, STEPS, HELD, MICRO = 512, 16, (16,), 64
AUTO = {"mode": "auto", "compressor": "powersgd", "bucket_cap_mb": 0.5, "min_compress_numel": 0,
        "auto": {"warmup_steps": 0, "interval_steps": 4,
                 "sample_steps": 2, "dwell": 1, "pin_below_numel": 0, "link": "nominal",
                 "link_gbit_s": 0.01, "detector_eta": None, "dense_dtype": "engine"}}


def _static(rank: int) -> dict:
    return {"mode": "static", "warmup_steps": 1, "bucket_cap_mb": 0.5, "min_compress_numel": 0,
            "compressor": {"type": "powersgd", "params": {"rank": rank}}}


def _factors(model: torch.nn.Module, width: int) -> dict[str, dict[str, torch.Tensor]]:
    """One seeded ``Qᵀ`` (width × m) per 512-wide matrix; a narrower run takes the leading rows of the same draw."""
    out = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        if p.dim() == 2 and p.shape[0] == WIDTH:
            g = torch.Generator().manual_seed(100 + i)
            out[name] = {"q": torch.randn(64, p.shape[1], generator=g)[:width].contiguous()}
    return out


def _run(section: dict, width: int, hold: int | None) -> dict[str, Any]:
    import ds_gravac
    from ds_gravac.adapt.auto.ladder import LOWRANK, Level, uniform_codes
    model = M.make_model(seed=0, width=WIDTH)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(section, micro=MICRO, lr=0.005))
    handle = ds_gravac.get_handle(engine)
    handle.compressor.load_state_dict({"replicated": {"factors": _factors(model, width)}})
    ctl = handle.controller
    if hold is not None:        # rank 0's decisions hold every group at rank `hold` (dense where it does not pay)
        def held(step: int, lr: float) -> torch.Tensor:
            return torch.tensor(uniform_codes(ctl.groups, Level(LOWRANK, float(hold))) + [0], dtype=torch.int64)
        ctl.propose = held
    losses = M.train(engine, torch.distributed.get_rank(), STEPS, micro=MICRO)
    records = handle.pop_stats()
    return {"params": M.params_of(engine), "losses": losses, "branches": [r["branch"] for r in records],
            "levels": [sorted({v for k, v in r.items() if k.startswith("auto/level/")}) for r in records]}


def _job(rank: int, world: int) -> dict:
    out = {}
    for r in HELD:
        out[r] = {"auto": _run(AUTO, 64, r), "static": _run(_static(r), r, None)}
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_job, 2)


@pytest.mark.parametrize("rank", HELD)
def test_auto_held_at_a_rank_follows_static_powersgd_at_that_rank(results: list[dict], rank: int) -> None:
    for res in results:
        auto, static = res[rank]["auto"], res[rank]["static"]
        assert auto["branches"][:2] == ["dense"] * 2 and static["branches"][:2] == ["dense"] * 2
        assert set(auto["branches"][2:]) == {"cand"} and set(static["branches"][2:]) == {"cand"}
        held = [lv for lv in auto["levels"][2:] if lv]        # the records that carry the plan
        assert held and all(float(rank) in lv for lv in held), auto["levels"]
        for name, want in static["params"].items():
            got = auto["params"][name]
            err = float((got - want).abs().max()) / float(want.abs().max())
            assert err < 1e-5, (name, err)       # float rounding (measured: ≤ 3.3e-7 after 16 steps)
