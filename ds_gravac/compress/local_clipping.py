"""Local gradient clipping: each rank clips its own gradient, per tensor, before it is compressed and averaged.

DeepSpeed's ``gradient_clipping`` clips the averaged update. Under compression that update is what a step
delivered, not the gradient: error feedback releases coordinates that waited in the residual in bursts, and DGC
sends momentum velocity. The DGC paper clips each rank's gradient instead, per tensor, at ``c/√N`` (N clipped
gradients then average to a norm of at most ``c/√N`` per tensor, the scale of a global clip at ``c`` with
independent gradients). ``"local_clipping": true`` selects it for every compressor; DGC always clips this way.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch


def local_limit(clip: float, world_size: int) -> float:
    """The per-tensor threshold of one rank's gradient for the engine's threshold ``clip``."""
    return clip / math.sqrt(max(1, world_size))


def clip_factor(norm: float, limit: float) -> float:
    """What to multiply a tensor of norm ``norm`` by so it is at most ``limit`` (1 when within or non-finite:
    a non-finite gradient is left for the step's finite check to skip)."""
    if limit <= 0.0 or not math.isfinite(norm) or norm <= limit:
        return 1.0
    return limit / norm


def grad_norm(g: torch.Tensor, inv_scale: float = 1.0) -> float:
    """‖g‖ of an (fp16 loss-scaled) gradient, unscaled, accumulated in float32 at least."""
    dtype = g.dtype if g.dtype in (torch.float32, torch.float64) else torch.float32
    return float(torch.linalg.vector_norm(g.detach(), dtype=dtype)) * inv_scale


def clip_in_place(grads: Sequence[torch.Tensor], inv_scale: float, limit: float) -> None:
    """Clip each gradient (a dense-sent tensor) to ``limit`` in place; the loss scale stays on it."""
    for g in grads:
        factor = clip_factor(grad_norm(g, inv_scale), limit)
        if factor != 1.0:
            g.mul_(factor)
