"""Gradient sets of the micro-benchmark: a model's real parameter shapes with seeded synthetic (or one real
backward's) gradients per simulated rank, and the memory-pass time every codec phase is measured against."""
from __future__ import annotations

import math
from typing import Optional

import torch

from .micro_settings import MODEL_ARGS, SMOKE_SHAPES
from .micro_timing import timed


def set_shapes(name: str, smoke: bool) -> list[tuple[str, tuple[int, ...]]]:
    """Named parameter shapes of the set's model, built on the meta device (no memory, no download)."""
    if smoke:
        return [(f"{name}.t{i}", s) for i, s in enumerate(SMOKE_SHAPES)]
    from runners.models import build_model
    model_name, kw = MODEL_ARGS[name]
    with torch.device("meta"):
        model = build_model(model_name, **kw)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def laplace_like(numel: int, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Laplace(0, scale) by inversion; |2u-1| is clamped below 1 so fp32 never yields an infinite sample."""
    s = torch.rand(numel, generator=gen).sub_(0.5)
    mag = s.abs().mul_(2.0).clamp_(max=1.0 - 2.0 ** -24).neg_().log1p_().neg_()
    return torch.copysign(mag, s).mul_(scale)


def synthetic_grads(shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> list[torch.Tensor]:
    """Seeded Laplace noise, one scale per tensor (10^-4 … 10^-1, log-uniform), flat fp32."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.empty(len(shapes)).uniform_(-4.0, -1.0, generator=gen)
    return [laplace_like(math.prod(s), float(10 ** sc), gen) for (_, s), sc in zip(shapes, scales)]


def real_grads(name: str, seed: int) -> list[torch.Tensor]:
    """Gradients of one forward/backward on synthetic inputs (batch 8 images, or 35x20 tokens)."""
    from runners.models import build_model
    torch.manual_seed(seed)
    model_name, kw = MODEL_ARGS[name]
    model = build_model(model_name, **kw)
    if name == "lstm":
        tokens = torch.randint(0, 10000, (36, 20))
        out, _ = model(tokens[:-1], model.init_hidden(20))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, 10000), tokens[1:].reshape(-1))
    else:
        images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, kw["num_classes"], (8,))
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    return [p.grad.detach().reshape(-1).clone() for p in model.parameters()]


def measure_compute(name: str, repeats: int) -> dict[str, float]:
    """Forward+backward time of the set's model at batch 32 (LSTM: 35 x 20 tokens)."""
    from runners.models import build_model
    model_name, kw = MODEL_ARGS[name]
    model = build_model(model_name, **kw)
    if name == "lstm":
        tokens = torch.randint(0, 10000, (36, 20))

        def step(_: int) -> None:
            out, _h = model(tokens[:-1], model.init_hidden(20))
            torch.nn.functional.cross_entropy(out.reshape(-1, 10000), tokens[1:].reshape(-1)).backward()
    else:
        images, labels = torch.randn(32, 3, 32, 32), torch.randint(0, kw["num_classes"], (32,))

        def step(_: int) -> None:
            torch.nn.functional.cross_entropy(model(images), labels).backward()
    return timed(step, max(1, min(repeats, 3)))


class GradSet:
    """One gradient set: names and shapes, the parameter values every simulated rank shares, one seeded gradient
    set per rank (rank 0's is the set's own), and the memory-pass reference."""

    def __init__(self, names: list[str], shapes: list[tuple[int, ...]], rank_grads: list[list[torch.Tensor]],
                 repeats: int) -> None:
        self.names, self.shapes, self.rank_grads, self.repeats = names, shapes, rank_grads, repeats
        self.grads = rank_grads[0]
        self.data = [torch.zeros(s) for s in shapes]
        self.numel = sum(g.numel() for g in self.grads)
        self.grad_bytes = sum(g.numel() * 4 for g in self.grads)      # the model's gradients in fp32
        self.scratch = [torch.empty_like(g) for g in self.grads]
        self.t_pass, self.t_pass_out = self.pass_now()

    def pass_now(self) -> tuple[dict[str, float], dict[str, float]]:
        """(fresh-output, preallocated-output) pass times, re-measured next to each measurement so load
        drift on a shared core cancels in the ratios."""
        fresh = timed(lambda _: [g.abs() for g in self.grads], self.repeats)
        out = timed(lambda _: [torch.abs(g, out=o) for g, o in zip(self.grads, self.scratch)], self.repeats)
        return fresh, out

    def passes(self, s: dict[str, float], ref: Optional[dict[str, float]] = None) -> float:
        """A time in memory passes: against ``ref``, else the set's own pass time."""
        return s["median"] / (ref or self.t_pass)["median"]

