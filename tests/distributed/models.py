"""Small models and DeepSpeed configs shared by the distributed tests (importable by spawned ranks)."""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import nn


class ThreeBucketNet(nn.Module):
    """Enough large tensors for >= 3 buckets at a small cap, plus a parameter that never gets a gradient."""

    def __init__(self, width: int = 64, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, classes)
        self.unused = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for layer in self.hidden:
            h = torch.relu(layer(h))
        return self.out(self.norm(h))


def make_model(seed: int = 0, **kw: Any) -> nn.Module:
    torch.manual_seed(seed)
    return ThreeBucketNet(**kw)


def ds_config(gravac: Optional[dict] = None, *, micro: int = 8, gas: int = 1, bf16: bool = False,
              world: int = 2, lr: float = 0.05, **extra: Any) -> dict:
    cfg = {"train_batch_size": micro * gas * world, "train_micro_batch_size_per_gpu": micro,
           "gradient_accumulation_steps": gas, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": 0},
           "optimizer": {"type": "SGD", "params": {"lr": lr, "momentum": 0.9, "weight_decay": 1e-4}},
           "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if gravac is not None:
        cfg["gravac"] = copy.deepcopy(gravac)
    cfg.update(extra)
    return cfg


def batch(rank: int, step: int, micro: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Different data per rank and step, deterministic."""
    g = torch.Generator().manual_seed(seed * 100003 + rank * 1009 + step)
    x = torch.randn(micro, 32, generator=g)
    y = torch.randint(0, 10, (micro,), generator=g)
    return x, y


def train(engine: Any, rank: int, steps: int, gas: int = 1, micro: int = 8, dtype: Optional[torch.dtype] = None,
          start: int = 0) -> list[float]:
    """DeepSpeed-style loop: backward and step() after every micro-batch; ``start`` continues a data stream."""
    losses = []
    for s in range(start, start + steps):
        for mb in range(gas):
            x, y = batch(rank, s * gas + mb, micro)
            if dtype is not None:
                x = x.to(dtype)
            loss = nn.functional.cross_entropy(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
    return losses


def params_of(engine: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}


def params_of_model(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def make_pipeline_module() -> nn.Module:
    from deepspeed.pipe import PipelineModule
    torch.manual_seed(0)
    layers = [nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)]
    return PipelineModule(layers=layers, num_stages=1, loss_fn=nn.CrossEntropyLoss())


class MoENet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE
        self.a = nn.Linear(32, 16)
        self.moe = MoE(16, nn.Linear(16, 16), num_experts=2, ep_size=1)
        self.b = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _, _ = self.moe(self.a(x))
        return self.b(h)


def make_moe_model() -> nn.Module:
    torch.manual_seed(0)
    return MoENet()


def force_dense(handle: Any, when: Callable[[int], bool]) -> None:
    """Send the steps where ``when(step)`` holds dense through the controller's own ``force_dense`` branch (the
    same steps on every rank, so every decision stays agreed)."""
    decide = handle.sync.controller.decide
    handle.sync.controller.decide = lambda step, lr, force_dense=False: decide(step, lr, force_dense or when(step))


def float64_momentum_sgd(width: int, steps: int, world: int, lr: float, momentum: float, wd: float,
                         sent: Callable[[int, int, str, torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Independent float64 reference of data-parallel momentum SGD on ``make_model(width=width)``: per step and
    rank the gradient of that rank's batch goes through ``sent(step, rank, name, grad)`` (what the rank
    contributes), the contributions are averaged and torch.optim.SGD's momentum/weight-decay rule applied."""
    model = make_model(width=width).double()
    names = [n for n, _ in model.named_parameters() if not n.startswith("unused")]
    params = dict(model.named_parameters())
    buf: dict[str, torch.Tensor] = {}
    for step in range(steps):
        avg = {n: torch.zeros_like(params[n]) for n in names}
        for rank in range(world):
            model.zero_grad()
            x, y = batch(rank, step)
            torch.nn.functional.cross_entropy(model(x.double()), y).backward()
            for n in names:
                avg[n] += sent(step, rank, n, params[n].grad.detach().clone()) / world
        with torch.no_grad():
            for n in names:
                d = avg[n] + wd * params[n]
                buf[n] = d.clone() if n not in buf else momentum * buf[n] + d
                params[n] -= lr * buf[n]
    return {n: params[n].detach() for n in names}
