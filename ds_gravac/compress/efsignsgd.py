"""``efsignsgd``: scaled sign compression with error feedback in update space (EF-signSGD).

The memory ``e`` lives in the space of parameter updates: each step forms ``p = γ·g + e`` (``γ`` = the learning
rate of the tensor's parameter group *at this step*: the synchronizer refreshes ``ctx.lr`` from the live param
groups before staging, so schedulers are followed), sends ``Δ = (‖p‖₁/L)·sign(p)`` in the mean-abs onebit layout
(``scale: fp32[1]`` + sign bits) and keeps ``e ← p − Δ``. The owner re-encodes its merged Δ the same way with its
own update-space residual. Because the aggregate is an update, the synchronizer divides each tensor's decoded
result by that tensor's γ before writing the gradient (``update_space = True``), so the optimizer's ``γ·G``
applies exactly the aggregate of Δ — which is why the optimizer must be plain SGD without momentum, and why
gradient clipping (which rescales G) breaks the correspondence. Tensors of different param groups may share a
partition: every element is scaled by its own tensor's γ, so the partition is one coherent update vector. With a
constant γ the algorithm is onebit (mean-abs) with error feedback, scaled by γ.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from . import signbits
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .memory import ResidualMemory
from .optimizers import find_optimizer
from .quantize import OwnMemoryQuantizer

Tensor = torch.Tensor


class EFSignSGDMemory(ResidualMemory):
    """The update-space error ``e`` is the memory and the input, ``x = γ·g + e`` (slot ``"e"`` in checkpoints)."""

    slots = ("e",)
    input_slot = "e"


class EFSignSGDParams(CompressorParams):
    """No parameters: error feedback is the algorithm."""


class EFSignSGD(OwnMemoryQuantizer):
    """Mean-abs sign compression of ``γ·g + e``; memory slot ``e`` (update space, per rank)."""

    name = "efsignsgd"
    Params = EFSignSGDParams
    GRID = (32.0,)
    CODES = signbits.BITS
    update_space = True
    Memory = EFSignSGDMemory

    @property
    def server_error_feedback(self) -> bool:
        return True

    def check_engine(self, engine: Any) -> None:
        """Warn unless the optimizer applies ``γ·G`` as it is: SGD without momentum, no gradient clipping."""
        sgd = find_optimizer(engine, torch.optim.SGD)
        if sgd is None or any(float(g.get("momentum", 0.0)) != 0.0 for g in sgd.param_groups):
            warnings.warn("ds_gravac: compressor 'efsignsgd' sends updates, not gradients; use torch.optim.SGD "
                          "without momentum", stacklevel=2)
        clip = getattr(engine, "gradient_clipping", None)
        clip = clip() if callable(clip) else clip
        if clip:
            warnings.warn(f"ds_gravac: compressor 'efsignsgd' sends updates; gradient_clipping ({clip:g}) rescales "
                          f"them, so the applied update is no longer the aggregate sent; set it to 0", stacklevel=2)

    def input_gain(self, ctx: CompressCtx) -> float:
        return float(ctx.lr)

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return signbits.sections(numel, 1)

    def code_bits(self, plan: TensorPlan) -> int:
        return 1

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        signbits.encode_mean_abs(x, out, self.ws)

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        return signbits.mean_abs_levels(p, dtype, scale)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        return signbits.mean_abs_sq_norm(p)
