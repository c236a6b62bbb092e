"""Save at step k, resume, continue == uninterrupted (residuals are non-zero at the save); a world-size change
resets residuals with a warning and keeps the controller state."""
from __future__ import annotations

import logging

import pytest
import torch

import models as M
from harness import run_ranks

GRAVAC = {"mode": "static", "compressor": "topk", "cf": 20, "bucket_cap_mb": 0.02, "min_compress_numel": 1000}


def _engine(gravac: dict, world: int) -> object:
    import ds_gravac
    model = M.make_model(seed=0)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, world=world))
    return engine


def _residual_norm(handle: object) -> float:
    """Norm of this rank's error-feedback residuals, read through the handle's public state."""
    slots = handle.state_dict()["local"]["memory"]["slots"]
    return sum(float(t.double().norm()) for t in slots["residual"].values())


def _resume_job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    straight = _engine(GRAVAC, world)
    M.train(straight, rank, 6)
    first = _engine(GRAVAC, world)
    M.train(first, rank, 3)
    handle = ds_gravac.get_handle(first)
    residual_norm = _residual_norm(handle)
    handle.save_checkpoint(save_dir, tag="k3")
    resumed = _engine(GRAVAC, world)
    path, _ = ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="k3")
    frozen = ds_gravac.get_handle(resumed).sync.plan.frozen
    M.train(resumed, rank, 3, start=3)
    return {"straight": M.params_of(straight), "resumed": M.params_of(resumed), "residual_norm": residual_norm,
            "loaded": path is not None, "frozen_after_load": frozen}


def _world_change_job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())
    logging.getLogger("ds_gravac").addHandler(Grab())
    engine = _engine(GRAVAC, world)
    handle = ds_gravac.get_handle(engine)
    handle.load_checkpoint(save_dir, tag="k3")
    residual_norm = _residual_norm(handle)
    M.train(engine, rank, 1, start=3)
    return {"warnings": records, "residual_norm": residual_norm, "params": M.params_of(engine)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list]:
    save_dir = str(tmp_path_factory.mktemp("ckpt"))
    return save_dir, run_ranks(_resume_job, 2, save_dir)


def test_resume_equals_uninterrupted(saved: tuple) -> None:
    _, results = saved
    for res in results:
        assert res["loaded"] and res["frozen_after_load"]
        assert res["residual_norm"] > 0, "the test must save non-zero residuals"
        for key, value in res["straight"].items():
            assert torch.equal(value, res["resumed"][key]), key


def test_per_rank_files_written(saved: tuple) -> None:
    import os
    save_dir, _ = saved
    assert sorted(f for f in os.listdir(os.path.join(save_dir, "k3")) if f.startswith("gravac_rank")) == [
        "gravac_rank00000.pt", "gravac_rank00001.pt"]


def test_world_size_change_resets_residuals_with_warning(saved: tuple) -> None:
    save_dir, _ = saved
    results = run_ranks(_world_change_job, 3, save_dir)
    for res in results:
        assert res["residual_norm"] == 0
        assert any("world_size=2, now 3" in w and "residuals reset" in w for w in res["warnings"])
    for key in results[0]["params"]:
        assert torch.equal(results[0]["params"][key], results[2]["params"][key])
