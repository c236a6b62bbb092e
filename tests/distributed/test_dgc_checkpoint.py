"""Checkpoints of a DGC run record the engine's own momentum, weight decay and clipping, not the zeros ds_gravac
sets while DGC applies them itself.

While DGC is attached the optimizer runs with momentum (and weight decay) 0 and the engine's clipping is 0. Saved
as they are, a checkpoint would resume a plain DeepSpeed run without momentum; loaded as they are, a checkpoint of a
plain run would give the attached optimizer its momentum back (momentum applied twice), and a detach after a load
restored the values into the optimizer's param groups of before the load, which ``load_state_dict`` had replaced.
"""
from __future__ import annotations

import models as M
from harness import run_ranks
from test_dgc_dense_steps import _rel_err

CLIP = 5.0
GRAVAC = {"mode": "static", "compressor": {"type": "dgc", "params": {"momentum": 0.9}}, "cf": 10,
          "min_compress_numel": 0}


def _config(gravac: dict | None) -> dict:
    cfg = M.ds_config(gravac)
    cfg["gradient_clipping"] = CLIP
    return cfg


def _engine(gravac: dict | None) -> object:
    import deepspeed
    import ds_gravac
    model = M.make_model(seed=0)
    init = ds_gravac.initialize if gravac is not None else deepspeed.initialize
    engine, *_ = init(model=model, model_parameters=model.parameters(), config=_config(gravac))
    return engine


def _settings(engine: object) -> dict:
    group = engine.optimizer.param_groups[0]
    return {"momentum": group["momentum"], "weight_decay": group["weight_decay"],
            "clipping": float(engine.gradient_clipping())}


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    out: dict = {}
    straight = _engine(GRAVAC)
    M.train(straight, rank, 6)
    out["straight"] = M.params_of(straight)

    dgc = _engine(GRAVAC)
    M.train(dgc, rank, 3)
    ds_gravac.get_handle(dgc).save_checkpoint(save_dir, tag="dgc")
    out["after_save"] = _settings(dgc)                           # still attached: zeros again

    plain = _engine(None)
    plain.load_checkpoint(save_dir, tag="dgc")
    out["plain_loads_dgc"] = _settings(plain)                    # the engine's own settings
    M.train(plain, rank, 1, start=3)
    plain.save_checkpoint(save_dir, tag="plain")

    resumed = _engine(GRAVAC)
    ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="dgc")
    M.train(resumed, rank, 3, start=3)
    out["resumed"] = M.params_of(resumed)

    dgc_loads_plain = _engine(GRAVAC)
    ds_gravac.get_handle(dgc_loads_plain).load_checkpoint(save_dir, tag="plain")
    out["dgc_loads_plain"] = _settings(dgc_loads_plain)          # zeros: DGC applies them
    ds_gravac.detach(dgc_loads_plain)
    out["detached_after_load"] = _settings(dgc_loads_plain)      # given back to the loaded param groups
    return out


def test_dgc_checkpoint_keeps_the_engine_settings(tmp_path) -> None:
    runs = run_ranks(_job, 2, str(tmp_path))
    own = {"momentum": 0.9, "weight_decay": 1e-4, "clipping": CLIP}
    zeros = {"momentum": 0.0, "weight_decay": 0.0, "clipping": 0.0}
    for r in runs:
        assert r["after_save"] == zeros
        assert r["plain_loads_dgc"] == own
        assert r["dgc_loads_plain"] == zeros
        assert r["detached_after_load"] == own
        assert _rel_err(r["resumed"], r["straight"], M.params_of_model(M.make_model(seed=0))) < 1e-6
