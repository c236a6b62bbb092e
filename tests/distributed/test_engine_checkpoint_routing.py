"""A script that knows nothing of ds_gravac checkpoints with ``engine.save_checkpoint`` / ``load_checkpoint``; while
ds_gravac is attached those are routed through the handle, so nothing is lost: the per-rank error-feedback
residuals come back on resume, and a DGC run records the engine's own momentum and clipping, not the zeros DGC
leaves in the optimizer while it applies them. Detach gives the engine DeepSpeed's methods back.
"""
from __future__ import annotations

import os

import models as M
from harness import run_ranks
from test_dgc_checkpoint import CLIP, GRAVAC as DGC, _engine, _settings
from test_dgc_dense_steps import _rel_err

TOPK = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 0}


def _job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    out: dict = {}
    straight = _engine(TOPK)
    M.train(straight, rank, 6)
    out["straight"] = M.params_of(straight)

    first = _engine(TOPK)
    M.train(first, rank, 3)
    out["residual_at_save"] = ds_gravac.get_handle(first).sync.memory.nonzero()
    first.save_checkpoint(save_dir, tag="topk")                          # DeepSpeed's API, not the handle's
    out["files"] = sorted(f for f in os.listdir(os.path.join(save_dir, "topk")) if f.startswith("gravac_rank"))

    resumed = _engine(TOPK)
    resumed.load_checkpoint(save_dir, tag="topk")
    M.train(resumed, rank, 3, start=3)
    out["resumed"] = M.params_of(resumed)

    without = _engine(TOPK)            # what resuming gave before: DeepSpeed's state without the residuals
    type(without).load_checkpoint(without, save_dir, tag="topk")         # DeepSpeed's own method
    M.train(without, rank, 3, start=3)
    out["without_residuals"] = M.params_of(without)

    dgc = _engine(DGC)
    M.train(dgc, rank, 2)
    dgc.save_checkpoint(save_dir, tag="dgc")
    plain = _engine(None)
    plain.load_checkpoint(save_dir, tag="dgc")
    out["plain_loads_dgc"] = _settings(plain)
    ds_gravac.detach(dgc)
    out["own_attributes_after_detach"] = sorted(k for k in ("save_checkpoint", "load_checkpoint") if k in vars(dgc))
    out["class_method_after_detach"] = dgc.save_checkpoint.__func__ is type(dgc).save_checkpoint
    return out


def test_engine_checkpoint_calls_keep_residuals_and_engine_settings(tmp_path) -> None:
    start = M.params_of_model(M.make_model(seed=0))
    for rank, r in enumerate(run_ranks(_job, 2, str(tmp_path))):
        assert r["residual_at_save"]
        assert r["files"] == ["gravac_rank00000.pt", "gravac_rank00001.pt"]
        assert _rel_err(r["resumed"], r["straight"], start) < 1e-6
        assert _rel_err(r["without_residuals"], r["straight"], start) > 1e-3, "the residuals must matter here"
        assert r["plain_loads_dgc"] == {"momentum": 0.9, "weight_decay": 1e-4, "clipping": CLIP}
        assert r["own_attributes_after_detach"] == [] and r["class_method_after_detach"], rank
