"""``"local_clipping": true``: each rank's gradient is clipped per tensor at ``gradient_clipping/√N`` before it is
compressed, in place of DeepSpeed clipping the averaged update.

Every step is forced dense through the controller's own branch, so the averaged update is the mean of the ranks'
clipped gradients; compressed (staged) and dense-classified tensors (below ``min_compress_numel``) are both
checked against an independent float64 reference: per rank, per tensor ``g·min(1, (c/√N)/‖g‖)``, averaged, then
``torch.optim.SGD`` with momentum and weight decay. The threshold binds on several tensors (the reference with and
without it differs by far more than the tolerance).
"""
from __future__ import annotations

import math

import torch
from torch import nn

import models as M
from harness import run_ranks
from test_dgc_dense_steps import _rel_err

STEPS, LR, CLIP, WORLD = 6, 0.05, 0.3, 2
GRAVAC = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 1000, "local_clipping": True}


def _reference(clip: float) -> dict:
    """float64, both ranks in one process, no DeepSpeed and no ds_gravac code."""
    model = M.make_model().double()
    params = [p for p in model.parameters()]
    opt = torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-4)
    for step in range(STEPS):
        mean = [torch.zeros_like(p) for p in params]
        for rank in range(WORLD):
            x, y = M.batch(rank, step)
            model.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x.double()), y).backward()
            for acc, p in zip(mean, params):
                if p.grad is None:
                    continue
                g = p.grad
                limit = clip / math.sqrt(WORLD)
                norm = float(g.norm())
                acc += (g * (limit / norm) if clip > 0 and norm > limit else g) / WORLD
        for acc, p in zip(mean, params):
            p.grad = acc
        opt.step()
    return M.params_of_model(model)


def _job(rank: int, world: int) -> dict:
    import ds_gravac
    model = M.make_model()
    cfg = M.ds_config(GRAVAC, lr=LR)
    cfg["gradient_clipping"] = CLIP
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    handle = ds_gravac.get_handle(engine)
    M.force_dense(handle, lambda step: True)
    dense_classified = any(not b.compressible for b in handle.sync.plan.buckets)
    attached = {"engine": float(engine.gradient_clipping()), "in_effect": handle.gradient_clipping()}
    M.train(engine, rank, STEPS)
    out = M.params_of(engine)
    ds_gravac.detach(engine)
    return {"params": out, "attached": attached, "detached": float(engine.gradient_clipping()),
            "dense_classified": dense_classified}


def test_local_clipping_equals_per_tensor_clipped_momentum_sgd() -> None:
    clipped, unclipped = _reference(CLIP), _reference(0.0)
    start = M.params_of_model(M.make_model())
    assert _rel_err(clipped, unclipped, start) > 0.05           # the threshold binds
    for r in run_ranks(_job, WORLD):
        assert r["dense_classified"]                             # both paths are exercised
        assert r["attached"] == {"engine": 0.0, "in_effect": CLIP} and r["detached"] == CLIP
        assert _rel_err(r["params"], clipped, start) < 1e-5
