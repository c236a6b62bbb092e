"""``ternary``: the original TernGrad, three levels ``{−s, 0, s}`` per partition.

Optional gradient clipping first (``clip_sigma``, default 2.5; 0 = off): ``x ← clamp(x, −c, c)`` with
``c = clip_sigma·std(x)`` (population standard deviation; a partition with zero spread is left unclipped, since it
has no outliers and clipping at 0 would erase it). The clipped part is lost unless ``error_feedback`` is on (the
residual is taken against the unclipped input). Then ``s = max|x|`` and ``t_i = sign(x_i)·Bernoulli(|x_i|/s)``
from the rank-local stream, decoded ``s·t_i`` — unbiased for the clipped x. Payload ``scale: fp32[1]`` + 2-bit
codes (0 → 0, 1 → +1, 2 → −1); θ = 16. The paper's per-layer scaler is per partition here.
"""
from __future__ import annotations

from typing import Optional

import torch
from pydantic import Field

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .quantize import STREAM_TERNARY, Quantizer, as_compute, emit, put_header, safe_std

Tensor = torch.Tensor


class TernaryParams(CompressorParams):
    clip_sigma: float = Field(2.5, ge=0.0)
    error_feedback: bool = False


class Ternary(Quantizer):
    """Stochastic ternarization with a max-abs scaler and optional σ-clipping."""

    name = "ternary"
    Params = TernaryParams
    gain_kind = "unbiased"
    GRID = (16.0,)

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return (Section("scale", torch.float32, 1), Section("codes", torch.int32, bitpack.packed_words(numel, 2)))

    def clip(self, x: Tensor) -> Tensor:
        """The clipped input the codes are unbiased for (``x`` itself when clipping is off)."""
        if self.params.clip_sigma == 0:
            return x
        c = self.params.clip_sigma * safe_std(x)
        c = torch.where(c > 0, c, torch.full_like(c, float("inf")))
        return torch.clamp(x, -c, c)

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        xc = self.clip(x)
        put_header(out["scale"], xc.abs().amax())
        s = as_compute(out["scale"][0], x)
        u = self.uniform(x, ctx, STREAM_TERNARY, server)
        keep = ((u < xc.abs() / s) & (s > 0)).to(torch.uint8)
        codes = keep.bitwise_left_shift((xc < 0).to(torch.uint8))   # 0, +1 → 1, −1 → 2 (one byte each)
        bitpack.pack(codes, 2, out["codes"])

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        s = as_compute(p["scale"][0], out) * scale
        c = bitpack.unpack(p["codes"], 2, p.plan.numel)
        emit(out, torch.where(c == 1, s, torch.where(c == 2, -s, torch.zeros_like(s))), accumulate)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        nz = (bitpack.unpack(p["codes"], 2, p.plan.numel) != 0).sum().double()
        return nz * p["scale"][0].double().square()
