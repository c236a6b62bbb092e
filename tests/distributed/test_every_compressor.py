"""Every registered sparse compressor on the real synchronizer: replicas stay bitwise identical, training is
finite, and the bytes sent are below dense (docs/algorithms.md)."""
from __future__ import annotations

import pytest
import torch

import models as M
from harness import run_ranks

COMPRESSORS = {
    "topk": {"cf": 20},
    "ef21": {"cf": 20},
    "randomk": {"cf": 20},
    "dgc": {"cf": 20, "min_compress_numel": 0, "compressor": {"type": "dgc", "params": {"momentum": 0.9}}},
    "redsync": {"cf": 20},
    "sidco": {"cf": 20},
    "threshold": {"cf": 20, "compressor": {"type": "threshold", "params": {"tau": 0.001}}},
    "graddrop": {"cf": 20},
}


def _job(rank: int, world: int) -> dict:
    import ds_gravac
    out = {}
    for name, extra in COMPRESSORS.items():
        gravac = {"mode": "static", "compressor": name, "bucket_cap_mb": 0.02, "min_compress_numel": 1000, **extra}
        model = M.make_model(seed=0)
        engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                          config=M.ds_config(gravac, gas=2))
        losses = M.train(engine, rank, 8, gas=2)
        stats = ds_gravac.get_handle(engine).last_stats()
        out[name] = {"params": M.params_of(engine), "losses": losses, "bytes": stats["bytes_sent"],
                     "dense": stats["dense_bytes"], "branch": stats["branch"]}
    return out


@pytest.fixture(scope="module")
def results() -> list:
    return run_ranks(_job, 2)


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_replicas_identical_and_compressed(results: list, name: str) -> None:
    a, b = results[0][name], results[1][name]
    for key in a["params"]:
        assert torch.isfinite(a["params"][key]).all(), key
        assert torch.equal(a["params"][key], b["params"][key]), key
    assert a["branch"] == "cand"
    assert a["bytes"] < 0.5 * a["dense"]
