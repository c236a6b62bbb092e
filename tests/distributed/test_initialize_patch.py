"""A script that replaces ``deepspeed.initialize`` by ``ds_gravac.initialize`` (or installs ``ds_gravac.launch``'s
replacement twice) gets a working engine, not an infinite recursion: DeepSpeed's own function is captured when
ds_gravac is imported."""
from __future__ import annotations

import models as M
from harness import run_ranks


def _job(rank: int, world: int) -> dict:
    import deepspeed
    import ds_gravac
    from ds_gravac.launch import install
    out = {}
    deepspeed.initialize = ds_gravac.initialize
    model = M.make_model(seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config({"mode": "static", "compressor": "topk", "cf": 10},
                                                         world=world))
    M.train(engine, rank, 2)
    out["patched"] = ds_gravac.get_handle(engine) is not None
    install()
    install()
    model = M.make_model(seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(None,
                                                                                                        world=world))
    M.train(engine, rank, 2)
    out["plain_left_alone"] = ds_gravac.get_handle(engine) is None
    return out


def test_replacing_deepspeed_initialize_does_not_recurse() -> None:
    for out in run_ranks(_job, 2):
        assert out == {"patched": True, "plain_left_alone": True}
