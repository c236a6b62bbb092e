"""``onebit``: 1-bit quantization with a per-partition scale (1-bit SGD).

Each element sends its sign bit (``x ≥ 0`` → 1). ``scale = "mean_abs"`` (default) sends one fp32
``s = ‖x‖₁/L`` and decodes ``±s``, so the decoded partition has exactly the input's L1 norm. ``"two_means"`` sends
``[μ+, μ−]``, the means of the non-negative and of the negative entries, and decodes each element to the mean of
its side, so the decoded partition has the input's sum. Payload: ``scale: fp32[1 or 2]``, ``bits:
int32[ceil(L/32)]``; θ = 32.

One bit per element discards almost everything, so error feedback is on by default (worker residual
``r = x − D(p)`` and the owner's server residual), which is what makes 1-bit SGD converge.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch

from . import signbits
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .quantize import Quantizer

Tensor = torch.Tensor


class OneBitParams(CompressorParams):
    scale: Literal["mean_abs", "two_means"] = "mean_abs"
    error_feedback: bool = True


class OneBit(Quantizer):
    """Sign bits plus a mean-abs scale (or two means); EF on by default."""

    name = "onebit"
    Params = OneBitParams
    GRID = (32.0,)
    CODES = signbits.BITS

    @property
    def two_means(self) -> bool:
        return self.params.scale == "two_means"

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return signbits.sections(numel, 2 if self.two_means else 1)

    def code_bits(self, plan: TensorPlan) -> int:
        return 1

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        if self.two_means:
            signbits.encode_two_means(x, out, self.ws)
        else:
            signbits.encode_mean_abs(x, out, self.ws)

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        return (signbits.two_means_levels if self.two_means else signbits.mean_abs_levels)(p, dtype, scale)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        return signbits.two_means_sq_norm(p) if self.two_means else signbits.mean_abs_sq_norm(p)
