"""DGC under DeepSpeed's ``gradient_clipping``: the clipping moves into the compressor.

DeepSpeed clips the averaged update; under DGC that is the momentum velocity, so engine-side clipping shrank DGC's
steps where dense momentum SGD clipped nothing. Here the threshold is chosen (from the float32 trajectory of this
model and data) so that it never binds on the averaged gradient nor on any rank's tensor at ``c/√2``, but binds on
the velocity (norms: averaged gradient ≤ 2.55, per-tensor local ≤ 1.78, velocity up to 4.73, c = 3.5). DGC with
every step dense and ``dense_keeps_momentum`` is then momentum SGD, so it must equal DeepSpeed's own momentum SGD
with the same clipping — which the test also checks equals DeepSpeed's without clipping (the threshold is slack on
gradients).
"""
from __future__ import annotations

from typing import Optional

import models as M
from harness import run_ranks
from test_dgc_dense_steps import _rel_err

STEPS, MICRO, LR, CLIP = 8, 256, 0.01, 3.5
DGC = {"momentum": 0.9, "dense_keeps_momentum": True}


def _config(clip: float, gravac: Optional[dict] = None) -> dict:
    cfg = M.ds_config(gravac, micro=MICRO, lr=LR)
    cfg["gradient_clipping"] = clip
    return cfg


def _reference(rank: int, clip: float) -> dict:
    import deepspeed
    model = M.make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_config(clip))
    M.train(engine, rank, STEPS, micro=MICRO)
    return M.params_of(engine)


def _dgc(rank: int, params: dict) -> tuple[dict, dict]:
    import ds_gravac
    model = M.make_model()
    gravac = {"mode": "static", "compressor": {"type": "dgc", "params": params}, "cf": 10, "min_compress_numel": 0}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=_config(CLIP, gravac))
    handle = ds_gravac.get_handle(engine)
    M.force_dense(handle, lambda step: True)
    from runners.systems import EngineSystem
    attached = {"engine": engine.gradient_clipping(), "clip_norm": handle.compressor.params.clip_norm,
                "runner_reports": EngineSystem("gravac", engine, handle, 2).gradient_clipping()}
    M.train(engine, rank, STEPS, micro=MICRO)
    out = M.params_of(engine)
    ds_gravac.detach(engine)
    return out, {**attached, "detached": engine.gradient_clipping()}


def _jobs(rank: int, world: int) -> dict:
    dgc, state = _dgc(rank, DGC)
    _, own_state = _dgc(rank, {**DGC, "clip_norm": 100.0})
    return {"clipped": _reference(rank, CLIP), "unclipped": _reference(rank, 0.0), "dgc": dgc, "state": state,
            "own_state": own_state}


def test_dgc_takes_over_gradient_clipping() -> None:
    runs = run_ranks(_jobs, 2)
    start = M.params_of_model(M.make_model())
    for r in runs:
        assert _rel_err(r["clipped"], r["unclipped"], start) < 1e-6     # slack on the averaged gradient
        assert _rel_err(r["dgc"], r["clipped"], start) < 1e-5           # DGC = DeepSpeed momentum SGD, clipped
        assert r["state"] == {"engine": 0.0, "clip_norm": CLIP, "runner_reports": CLIP, "detached": CLIP}
        assert r["own_state"] == {"engine": 0.0, "clip_norm": 100.0, "runner_reports": 100.0,   # a set clip_norm
                                  "detached": CLIP}                                           # is kept
