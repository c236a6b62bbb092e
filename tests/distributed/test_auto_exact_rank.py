"""``mode: "auto"`` on real gloo ranks finds a layer that a ladder rank sends exactly, and keeps it there.

Three 256 × 256 fully connected layers regress 12 random samples per rank onto random targets on two ranks: the
averaged gradient of each has rank ≤ 24 and a flat spectrum, so rank 32 sends it exactly (to 10⁻⁸) and rank 16
leaves a quarter unsent. (At a rank equal to the bound — 16 samples a rank — the projection is ill-conditioned, and
under error feedback the unsent fraction grew from 10⁻⁸ to 6% in 8 steps.) On a nominal 10 Mbit/s link the rank-16 reference would let the hidden class go to rank 16 or lower;
measured exact, it is referenced at rank 32 (zero error, zero cap) and goes to rank 32 or dense. The dense steps
all-reduce in bf16 (the default ``dense_dtype``), whose rounding stays far below ``auto.exact_fraction``.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

MICRO, WIDTH, STEPS = 12, 256, 11
AUTO = {"mode": "auto", "compressor": "powersgd", "min_compress_numel": 0,
        "auto": {"warmup_steps": 0, "interval_steps": 4,
                 "dwell": 0, "pin_below_numel": 0, "link": "nominal", "link_gbit_s": 0.01,
                 "detector_eta": None}}
GROUP = f"{WIDTH}x{WIDTH}"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                         nn.Linear(WIDTH, WIDTH))      # the last is the classifier: a group of its own


def _job(rank: int, world: int) -> dict:
    import ds_gravac
    model = _model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(AUTO, world=world, micro=MICRO, lr=0.01))
    ctl = ds_gravac.get_handle(engine).controller
    plans: list[dict] = []
    accept = ctl.accept

    def watched(step: int, proposal: Any) -> set:
        out = accept(step, proposal)
        plans.extend(e for e in ctl.pop_events() if e["event"] == "auto_plan")
        return out
    ctl.accept = watched
    for step in range(STEPS):
        data = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(MICRO, WIDTH, generator=data), torch.randn(MICRO, WIDTH, generator=data)
        engine.backward(nn.functional.mse_loss(engine(x), y))
        engine.step()
    index = next(g.index for g in ctl.groups if g.name == GROUP)
    group = ctl.groups[index]
    levels = [r[f"auto/level/{GROUP}"] for r in ds_gravac.get_handle(engine).pop_stats()]
    return {"frac": dict(zip(ctl.signals.ranks, ctl.signals.frac[index])), "levels": levels,
            "plans": [(p["step"], p["reference_error"][index], p["error"][index]) for p in plans],
            "ladder": [float(lv.value) for lv in group.ladder], "params": M.params_of(engine)}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_job, 2)


def test_rank_32_is_measured_exact_and_rank_16_is_not(results: list[dict]) -> None:
    from ds_gravac.config import AutoConfig
    frac = results[0]["frac"]
    assert results[0]["ladder"] == [0.0, 32.0, 16.0, 8.0, 4.0, 2.0]        # rank 64 does not pay on 256 × 256
    assert 0.0 <= frac[32] <= AutoConfig().exact_fraction / 100    # bf16's rounding of the dense steps' mean
    assert frac[16] > 0.2                             # a flat spectrum: rank 16 leaves much of it
    assert frac[64] == -1.0                           # never measured: not on the ladder
    assert results[1]["frac"] == frac                 # agreed


def test_the_group_is_referenced_at_rank_32_and_kept_exact_or_dense(results: list[dict]) -> None:
    """At every decision the group's reference and plan error are zero, and it travels at rank 32 or dense, never
    at rank 16 or below."""
    plans = results[0]["plans"]
    assert [step for step, *_ in plans] == [2, 6, 10]
    assert all(ref == 0.0 and err == 0.0 for _, ref, err in plans)
    levels = results[0]["levels"]
    assert set(levels) <= {0.0, 32.0}                  # dense or exact
    assert 32.0 in levels[6:]                          # the quiet plan on this slow link sends it at rank 32
    assert results[1]["levels"] == levels and results[1]["plans"] == plans
    for name, value in results[0]["params"].items():
        assert value.equal(results[1]["params"][name]), name
