"""``ternary``: the original TernGrad, three levels ``{−s, 0, s}`` per partition.

Optional gradient clipping first (``clip_sigma``, default 2.5; 0 = off): ``x ← clamp(x, −c, c)`` with
``c = clip_sigma·std(x)`` (population standard deviation, accumulated in float64; a partition with zero spread is
left unclipped, since it has no outliers and clipping at 0 would erase it). The clipped part is lost unless
``error_feedback`` is on (the residual is taken against the unclipped input). Then ``s = max|x|`` and ``t_i = sign(x_i)·Bernoulli(|x_i|/s)``
from the rank-local stream, decoded ``s·t_i`` — unbiased for the clipped x. Payload ``scale: fp32[1]`` + 2-bit
codes (0 → 0, 1 → +1, 2 → −1); θ = 16. The paper's per-layer scaler is per partition here.
"""
from __future__ import annotations

from typing import Optional

import torch
from pydantic import Field

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .kinds import GainKind
from .qkernels import chunk_size, encode_blocks, std64
from .quantize import STREAM_TERNARY, Quantizer, put_header

Tensor = torch.Tensor


class TernaryParams(CompressorParams):
    clip_sigma: float = Field(2.5, ge=0.0)
    error_feedback: bool = False


class Ternary(Quantizer):
    """Stochastic ternarization with a max-abs scaler and optional σ-clipping."""

    name = "ternary"
    Params = TernaryParams
    gain_kind = GainKind.UNBIASED
    GRID = (16.0,)

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return (Section("scale", torch.float32, 1), Section("codes", torch.int32, bitpack.packed_words(numel, 2)))

    def code_bits(self, plan: TensorPlan) -> int:
        return 2

    def clip_bound(self, x: Tensor) -> Optional[Tensor]:
        """``c = clip_sigma·std(x)`` in x's dtype (std in float64), ``inf`` for zero spread; None when off."""
        if self.params.clip_sigma == 0:
            return None
        c = self.params.clip_sigma * std64(x, self.ws).to(x.dtype)
        return torch.where(c > 0, c, torch.full_like(c, float("inf")))

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        c = self.clip_bound(x)
        lo_x, hi_x = torch.aminmax(x)
        top = torch.maximum(lo_x.abs(), hi_x.abs())                # max |x|
        put_header(out["scale"], top if c is None else torch.minimum(top, c))   # = max |clamp(x, −c, c)|
        s = out["scale"][0].to(x.dtype)
        gen = self.stream(x, ctx, STREAM_TERNARY, server)
        step = chunk_size()
        ratio, neg = self.scratch(x, step, "ter_ratio", "ter_neg")

        def codes(lo: int, hi: int) -> Tensor:   # 0, +1 → 1, −1 → 2
            xc, m = x[lo:hi], hi - lo
            r = torch.abs(xc, out=ratio[:m])
            if c is not None:
                r.clamp_(max=c)                                   # |clamp(x, −c, c)|
            r.div_(s)                                             # s = 0 or NaN: NaN, never kept
            keep = torch.lt(self.draws(gen, m, x.device), r, out=r)     # Bernoulli(|x_c|/s)
            return keep.addcmul_(keep, torch.lt(xc, 0, out=neg[:m]))

        encode_blocks(x.numel(), 2, out["codes"], step, codes, self.ws)

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        """Codes 0, 1, 2 (and the unused 3) decode to ``0, s, −s, 0`` times ``scale``."""
        s = p["scale"][0].to(dtype) * scale
        zero = torch.zeros_like(s)
        return torch.stack([zero, s, -s, zero])

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        nz = (bitpack.unpack(p["codes"], 2, p.plan.numel) != 0).sum().double()
        return nz * p["scale"][0].double().square()
