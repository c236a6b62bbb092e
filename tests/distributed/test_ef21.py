"""``ef21`` on the real synchronizer follows an independent float64 simulation of EF21-Top-k momentum SGD, keeps
replicas identical, and resumes from a checkpoint exactly (its estimates ``h`` and ``H`` are saved).

The reference never touches ds_gravac: per rank it keeps an estimate ``h`` of the rank's gradient, sends the
ceil(n/θ) largest entries of ``g − h`` (tensors under ``min_compress_numel`` go dense), adds them to ``h``, and
applies the mean of the estimates with torch.optim.SGD's momentum/weight-decay rule. A dense step (the first one,
and the forced ones) sets ``h = g`` and applies the exact mean.
"""
from __future__ import annotations

import math

import pytest
import torch

import models as M
from harness import run_ranks

MIN_NUMEL, STEPS, LR, MOMENTUM, WD, WIDTH, CF = 1000, 12, 0.05, 0.9, 1e-4, 300, 10
DENSE_STEPS = frozenset({4, 7})
GRAVAC = {"mode": "static", "compressor": "ef21", "cf": CF, "min_compress_numel": MIN_NUMEL}


def _engine() -> object:
    import ds_gravac
    model = M.make_model(width=WIDTH)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(GRAVAC, lr=LR))
    return engine


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    engine = _engine()
    handle = ds_gravac.get_handle(engine)
    M.force_dense(handle, DENSE_STEPS.__contains__)
    M.train(engine, rank, STEPS)
    branches = [r["branch"] for r in handle.pop_stats()]
    straight = _engine()
    M.train(straight, rank, 6)
    first = _engine()
    M.train(first, rank, 3)
    ds_gravac.get_handle(first).save_checkpoint(save_dir, tag="k3")
    resumed = _engine()
    loaded, _ = ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="k3")
    M.train(resumed, rank, 3, start=3)
    return {"params": M.params_of(engine), "branches": branches, "straight": M.params_of(straight),
            "resumed": M.params_of(resumed), "loaded": loaded is not None}


def _reference(world: int) -> dict[str, torch.Tensor]:
    estimate: dict[tuple[int, str], torch.Tensor] = {}

    def sent(step: int, rank: int, name: str, grad: torch.Tensor) -> torch.Tensor:
        if grad.numel() < MIN_NUMEL:
            return grad
        if step == 0 or step in DENSE_STEPS:
            estimate[rank, name] = grad
        else:
            change = (grad - estimate[rank, name]).flatten()
            top = change.abs().topk(math.ceil(change.numel() / CF)).indices
            update = torch.zeros_like(change)
            update[top] = change[top]
            estimate[rank, name] = estimate[rank, name] + update.view_as(grad)
        return estimate[rank, name]

    return M.float64_momentum_sgd(WIDTH, STEPS, world, LR, MOMENTUM, WD, sent)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list:
    return run_ranks(_job, 2, str(tmp_path_factory.mktemp("ef21_ckpt")))


def test_ef21_matches_float64_reference(results: list) -> None:
    ref = _reference(2)
    start = M.params_of_model(M.make_model(width=WIDTH))
    want_branches = ["dense" if s == 0 or s in DENSE_STEPS else "cand" for s in range(STEPS)]
    for res in results:
        assert res["branches"] == want_branches, res["branches"]
        for name, want in ref.items():
            got = res["params"][name].double()
            moved = (want - start[name].double()).norm()
            assert moved > 0
            assert (got - want).norm() / moved < 1e-4, name


def test_ef21_replicas_identical_and_resume_exact(results: list) -> None:
    a, b = results
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name
    for res in results:
        assert res["loaded"]
        for name, want in res["straight"].items():
            assert torch.equal(res["resumed"][name], want), name
