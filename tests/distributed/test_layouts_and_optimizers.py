"""Any gradient layout and any optimizer that edits gradients in place.

* ``channels_last`` CNNs (how CNNs are trained fast on GPUs) have non-contiguous gradients: ``mode: "dense"`` is
  bit-identical to DeepSpeed on them, and Top-k and DGC train on them with identical replicas.
* Decoded gradients are views of an internal buffer (no copy pass). An optimizer that changes ``p.grad`` in place
  (maximize, weight decay added into the gradient, torch's foreach paths) must not corrupt the next step: with
  ``mode: "dense"`` the result is DeepSpeed's, and compressed runs equal the same run with an optimizer that computes
  the very same update without touching ``p.grad``.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks


class SmallResNet(nn.Module):
    """A residual CNN with a 131,072-value convolution (compressed) and small dense-classified tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 128, 3, padding=1)
        self.bn = nn.BatchNorm2d(128)
        self.block = nn.Conv2d(128, 128, 3, padding=1, bias=False)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.stem(x)))
        h = h + torch.relu(self.block(h))
        return self.head(h.mean((2, 3)))


def _cnn_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)


def _channels_last_job(rank: int, world: int) -> dict:
    import deepspeed

    import ds_gravac
    out = {}
    systems = {"deepspeed": None, "dense": {"mode": "dense", "bucket_cap_mb": 0.2},
               "topk": {"mode": "static", "compressor": "topk", "cf": 20, "min_compress_numel": 10000,
                        "bucket_cap_mb": 0.2},
               "dgc": {"mode": "static", "compressor": {"type": "dgc", "params": {"momentum": 0.9}}, "cf": 20,
                       "min_compress_numel": 0, "bucket_cap_mb": 0.2}}
    for name, gravac in systems.items():
        torch.manual_seed(0)
        model = SmallResNet()
        init = deepspeed.initialize if gravac is None else ds_gravac.initialize
        engine, *_ = init(model=model, model_parameters=model.parameters(), config=M.ds_config(gravac, micro=4))
        # after initialize: DeepSpeed 0.19.8's parameter broadcast cannot view channels_last tensors as bytes
        engine.module.to(memory_format=torch.channels_last)
        losses = []
        for s in range(6):
            x, y = _cnn_batch(rank, s)
            loss = nn.functional.cross_entropy(engine(x.to(memory_format=torch.channels_last)), y)
            engine.backward(loss)
            if s == 5:
                out[name + "_grad_layout"] = engine.module.block.weight.grad.is_contiguous(
                    memory_format=torch.channels_last)
            engine.step()
            losses.append(float(loss))
        out[name] = M.params_of(engine)
        out[name + "_losses"] = losses
        out[name + "_branch"] = ds_gravac.get_handle(engine).last_stats()["branch"] if gravac else None
    return out


def test_channels_last_dense_is_deepspeed_and_compressors_train() -> None:
    r0, r1 = run_ranks(_channels_last_job, 2)
    assert r0["deepspeed_grad_layout"] and r0["topk_grad_layout"], "the gradients must really be channels_last"
    for key, ref in r0["deepspeed"].items():
        assert torch.equal(r0["dense"][key], ref), key
    for name in ("topk", "dgc"):
        assert r0[name + "_branch"] == "cand"
        for key in r0[name]:
            assert torch.isfinite(r0[name][key]).all() and torch.equal(r0[name][key], r1[name][key]), (name, key)
        assert not torch.equal(r0[name]["block.weight"], r0["dense"]["block.weight"])   # really compressed


class EditGradSGD(torch.optim.Optimizer):
    """SGD with weight decay and maximize; ``in_place`` adds the decay into ``p.grad`` and negates it there (as
    older optimizers and torch's own paths for some options do), otherwise the same arithmetic on a copy."""

    def __init__(self, params, lr: float, weight_decay: float, in_place: bool) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        self.in_place = in_place

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad if self.in_place else p.grad.clone()
                d.add_(p, alpha=group["weight_decay"])
                d.neg_()                                   # maximize: ascend
                p.add_(d, alpha=group["lr"])


def _inplace_job(rank: int, world: int) -> dict:
    import deepspeed

    import ds_gravac
    out = {}
    runs = {("deepspeed", "torch"): None, ("dense", "torch"): {"mode": "dense", "bucket_cap_mb": 0.02}}
    topk = {"mode": "static", "compressor": "topk", "cf": 100, "min_compress_numel": 1000, "bucket_cap_mb": 0.02}
    for opt in ("in_place", "copy"):
        runs[("topk", opt)] = topk
        runs[("dense", opt)] = {"mode": "dense", "bucket_cap_mb": 0.02}
        runs[("deepspeed", opt)] = None
    for (system, opt), gravac in runs.items():
        model = M.make_model(width=128)
        if opt == "torch":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=0.01, maximize=True, foreach=True)
        else:
            optimizer = EditGradSGD(model.parameters(), lr=0.01, weight_decay=0.01, in_place=opt == "in_place")
        cfg = M.ds_config(gravac)
        del cfg["optimizer"]
        init = deepspeed.initialize if gravac is None else ds_gravac.initialize
        engine, *_ = init(model=model, optimizer=optimizer, model_parameters=model.parameters(), config=cfg)
        M.train(engine, rank, 8)
        out[(system, opt)] = M.params_of(engine)
    return out


@pytest.fixture(scope="module")
def inplace_results() -> list:
    return run_ranks(_inplace_job, 2)


def test_dense_with_grad_editing_optimizers_is_deepspeed(inplace_results: list) -> None:
    for res in inplace_results:
        for opt in ("torch", "in_place", "copy"):
            for key, ref in res[("deepspeed", opt)].items():
                assert torch.equal(res[("dense", opt)][key], ref), (opt, key)


def test_compressed_with_grad_editing_optimizer_equals_the_copying_one(inplace_results: list) -> None:
    for res in inplace_results:
        for key, ref in res[("topk", "copy")].items():
            assert torch.equal(res[("topk", "in_place")][key], ref), key
        assert not torch.equal(res[("topk", "copy")]["hidden.0.weight"], res[("dense", "copy")]["hidden.0.weight"])


def _bf16_groups_job(rank: int, world: int) -> dict:
    """The hyper-parameters compressors read per tensor (DGC's local weight decay and momentum) under bf16, where
    DeepSpeed's bf16 optimizer replaces the wrapped optimizer's ``params`` by fp32 master copies."""
    import ds_gravac
    model = M.make_model(seed=0).to(torch.bfloat16)
    gravac = {"mode": "static", "compressor": {"type": "dgc", "params": {"momentum": 0.9}}, "cf": 10,
              "bucket_cap_mb": 0.02, "min_compress_numel": 0}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, world=world, bf16=True, lr=0.05))
    planner = ds_gravac.get_handle(engine).sync.planner
    return {"hyper": sorted({(c.lr, c.weight_decay, c.momentum) for ctxs in planner.ctxs.values() for c in ctxs})}


def test_compressors_see_the_groups_hyperparameters_under_bf16() -> None:
    """Regression: under bf16 every tensor used to get lr 0, weight decay 0 and momentum 0 (no group found), so
    DGC silently dropped its local weight decay."""
    for out in run_ranks(_bf16_groups_job, 2):
        assert out["hyper"] == [(0.05, 1e-4, 0.9)]
