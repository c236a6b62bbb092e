"""Hugging Face Trainer + DeepSpeed + GravacCallback on 2 real gloo ranks."""
from __future__ import annotations

import pytest
import torch

from harness import run_ranks

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

DS = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 16,
      "gradient_clipping": 0.0, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9,
      "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}}


def _hf_job(rank: int, world: int, out: str) -> dict:
    import copy

    from runners.train_hf import build_trainer

    import ds_gravac
    results = {}
    for name, gravac, callback in (("plain", None, False), ("none", {"mode": "static", "compressor": "none"}, True),
                                   ("topk", {"mode": "static", "compressor": "topk", "cf": 50,
                                             "min_compress_numel": 1000}, True)):
        cfg = copy.deepcopy(DS)
        if gravac is not None:
            cfg["gravac"] = gravac
        trainer = build_trainer(cfg, f"{out}/{name}", steps=6, callback=callback)
        trainer.train()
        engine = trainer.model_wrapped
        handle = ds_gravac.get_handle(engine)
        results[name] = {"params": {n: p.detach().float().clone() for n, p in engine.module.named_parameters()},
                         "bytes": handle.last_stats()["bytes_sent"] if handle else None,
                         "dense": handle.last_stats()["dense_bytes"] if handle else None,
                         "flag": engine.enable_backward_allreduce}
    results["resume"] = _hf_resume(f"{out}/resume")
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list:
    return run_ranks(_hf_job, 2, str(tmp_path_factory.mktemp("hf")), timeout=500)


def test_callback_none_equals_plain_trainer_and_topk_sends_less(runs: list) -> None:
    for res in runs:
        assert res["none"]["flag"] is False and res["plain"]["flag"] is True
        for key, ref in res["plain"]["params"].items():
            assert torch.equal(ref, res["none"]["params"][key]), key
        assert res["topk"]["bytes"] < 0.2 * res["topk"]["dense"]
        assert res["none"]["bytes"] == pytest.approx(res["none"]["dense"])


def _hf_resume(out: str) -> dict:
    import copy
    import os

    from runners.train_hf import build_trainer

    import ds_gravac
    cfg = copy.deepcopy(DS)
    cfg["gravac"] = {"mode": "static", "compressor": "topk", "cf": 50, "min_compress_numel": 1000}
    straight = build_trainer(cfg, out, steps=4, save_steps=2)
    straight.train()
    params = {n: p.detach().float().clone() for n, p in straight.model_wrapped.module.named_parameters()}
    tag_dir = os.path.join(out, "checkpoint-2", "global_step2")
    files = sorted(f for f in os.listdir(tag_dir) if f.startswith("gravac_rank"))
    resumed = build_trainer(cfg, out, steps=4, save_steps=2)
    resumed.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))
    handle = ds_gravac.get_handle(resumed.model_wrapped)
    return {"files": files, "straight": params,
            "resumed": {n: p.detach().float().clone() for n, p in resumed.model_wrapped.module.named_parameters()},
            "restored_memory": handle.sync.memory.nonzero()}


def test_trainer_checkpoint_carries_the_residuals(runs: list) -> None:
    """The Trainer saves through engine.save_checkpoint, which the attached handle routes through its own: the
    per-rank files are in the checkpoint and a resumed run continues the uninterrupted one."""
    for res in (r["resume"] for r in runs):
        assert res["files"] == ["gravac_rank00000.pt", "gravac_rank00001.pt"]
        assert res["restored_memory"]
        for key, ref in res["straight"].items():
            torch.testing.assert_close(res["resumed"][key], ref, rtol=1e-5, atol=1e-6, msg=key)
