"""DeepSpeed's leaked /dev/shm all-reduce buffer is released by attach, and the shm all-reduce still works after."""
from __future__ import annotations

import models as M
from harness import run_ranks


def _job(rank: int, world: int) -> dict:
    import deepspeed
    import torch
    import ds_gravac
    from ds_gravac.integration.shm_buffer import shm_buffer_path

    path = shm_buffer_path(rank)
    model = M.make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config({"mode": "static", "compressor": "topk", "cf": 10}))
    existed = path.exists()
    ds_gravac.attach(engine)
    gone = not path.exists()
    M.train(engine, rank, 2)
    ones = torch.ones(8) * (rank + 1)
    deepspeed.comm.inference_all_reduce(ones)       # the op that maps the peers' buffers
    return {"existed": existed, "gone": gone, "sum": ones.tolist()}


def test_attach_releases_deepspeeds_shm_buffer() -> None:
    for res in run_ranks(_job, 2):
        assert res["existed"], "DeepSpeed 0.19.8 creates the buffer for all-local ranks (LOCAL_SIZE == world)"
        assert res["gone"]
        assert res["sum"] == [3.0] * 8
