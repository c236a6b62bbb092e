"""A benchmark control, not a compressor: multiply every averaged gradient by ``1 + rel·N(0, 1)`` per element.

Why. Comparing a compressed run with the dense run of the same seed only means something if the dense run is
not itself one sample out of a wide spread. With ``rel`` about ten float32 ulps (``1e-6``), the perturbation is far
below any compressor's error, unbiased, and identical on every rank (the noise is drawn from a generator seeded
by ``(seed, step)`` after the averaging, so every replica keeps the same weights). How far such a run ends from
the unperturbed one is the noise floor of a per-seed loss gap (``runner --grad-jitter``; the fidelity
benchmark's system ``ds_dense_jitter``).
"""
from __future__ import annotations

from typing import Iterable

import torch

from ds_gravac.compress.base import mix_seed

MAX_REL = 0.1
JITTER_STREAM = 0x6A17      # keeps these draws apart from any other (seed, step) stream


def jitter_seed(seed: int, step: int) -> int:
    """One generator seed per (run seed, optimizer step), the same on every rank."""
    return mix_seed(seed, step, JITTER_STREAM)


@torch.no_grad()
def jitter_gradients_(params: Iterable[torch.nn.Parameter], rel: float, seed: int, step: int) -> None:
    """``g ← g·(1 + rel·ε)``, ``ε ~ N(0, 1)`` per element, for every parameter with a gradient, in order."""
    if not 0.0 <= rel <= MAX_REL:
        raise ValueError(f"grad jitter: rel must be in [0, {MAX_REL}], got {rel}")
    if rel == 0.0:
        return
    gens: dict[torch.device, torch.Generator] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        gen = gens.get(g.device)
        if gen is None:
            gen = gens[g.device] = torch.Generator(device=g.device)
            gen.manual_seed(jitter_seed(seed, step))
        noise = torch.randn(g.shape, generator=gen, device=g.device, dtype=g.dtype)
        g.mul_(noise.mul_(rel).add_(1.0))


__all__ = ["jitter_gradients_", "jitter_seed", "MAX_REL"]
