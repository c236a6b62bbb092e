"""``qsgd``: stochastic quantization to ``s`` levels per block of ``B`` elements (QSGD).

The partition is cut into blocks of ``bucket_size`` B (a quantization block, unrelated to communication
buckets; the last block is zero-padded). Per block ``ν = ‖x_B‖₂``, ``ℓ_i = s·|x_i|/ν`` and
``q_i = floor(ℓ_i) + Bernoulli(ℓ_i − floor ℓ_i)`` (rank-local stream), code ``sign(x_i)·q_i ∈ [−s, s]``; ``ν = 0``
gives zero codes. Decode ``ν·code/s``: unbiased, with ``E‖D − x_B‖² ≤ min(B/s², √B/s)·‖x_B‖²``. Wire: ``norms:
fp32[ceil(L/B)]`` + codes in offset binary (``code + s``) at the smallest width ``w ∈ {2, 4, 8, 16}`` with
``2^w ≥ 2s + 1``. The level picks s: θ ∈ {16, 8, 4} ↔ s ∈ {1, 7, 127} (w = 2, 4, 8); the ``levels`` parameter is
the default level.

Norms are computed overflow-free (scaled by the block max), stored in fp32 (clamped to its maximum) and the
stored value is what both encoder and decoder use, so ``|D_i − x_i| ≤ ν/s`` holds for the sent ν.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .qkernels import AffineDecoder, chunk_size, encode_blocks
from .quantize import FP32_MAX, STREAM_QSGD, Quantizer, ceil_div

Tensor = torch.Tensor
LEVELS_FOR_CF = {16.0: 1, 8.0: 7, 4.0: 127}


def code_width(levels: int) -> int:
    """Smallest packable width holding the ``2s + 1`` offset-binary codes."""
    return next(w for w in bitpack.WIDTHS[1:] if (1 << w) >= 2 * levels + 1)


class QSGDParams(CompressorParams):
    levels: Literal[1, 7, 127] = 127
    bucket_size: int = Field(128, ge=1, le=1 << 20)
    error_feedback: bool = False


class QSGD(Quantizer):
    """Per-block L2-normalized stochastic quantization to ``s`` levels."""

    name = "qsgd"
    Params = QSGDParams
    gain_kind = "unbiased"
    GRID = (4.0, 8.0, 16.0)

    def default_cf(self) -> float:
        return 32.0 / code_width(self.params.levels)

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        width = code_width(LEVELS_FOR_CF[theta])
        return (Section("norms", torch.float32, ceil_div(numel, self.params.bucket_size)),
                Section("codes", torch.int32, bitpack.packed_words(numel, width)))

    def plan_extra(self, theta: float) -> tuple[tuple[str, object], ...]:
        s = LEVELS_FOR_CF[theta]
        return (("levels", s), ("width", code_width(s)))

    def code_bits(self, plan: TensorPlan) -> int:
        return plan.get("width")

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        s = plan.get("levels")
        b, n = self.params.bucket_size, x.numel()
        norms = out["norms"]
        gen = self.stream(x, ctx, STREAM_QSGD, server)
        step = chunk_size(b)
        span = min(step, ceil_div(n, b) * b)
        pad, mag, val, neg = (self.ws.get(name, span, x.dtype, x.device)
                              for name in ("qs_pad", "qs_mag", "qs_val", "qs_neg"))

        def codes(lo: int, hi: int) -> Tensor:
            m, r0 = hi - lo, lo // b
            r = ceil_div(m, b)
            xr = x[lo:hi]
            if r * b != m:                                   # the last block, zero-padded
                xr = pad[:r * b]
                xr[:m].copy_(x[lo:hi])
                xr[m:].zero_()
            xr = xr.view(r, b)
            a = torch.abs(xr, out=mag[:r * b].view(r, b))
            norms[r0:r0 + r].copy_(rows_norm(xr, a, val[:r * b].view(r, b)).clamp_(max=FP32_MAX))
            nu = norms[r0:r0 + r].to(x.dtype)[:, None]      # the stored values, as the decoder sees them
            nu = torch.where(nu > 0, nu, float("nan"))      # an empty block: NaN levels, sent as code 0
            u = self.draws(gen, r * b, x.device).view(r, b)
            q = torch.addcdiv(u, a, nu, value=s, out=val[:r * b].view(r, b)).floor_()   # ⌊|x|·s/ν + u⌋
            q.nan_to_num_(0.0).clamp_(0, s)
            code = torch.addcmul(q, q, torch.lt(xr, 0, out=neg[:r * b].view(r, b)), value=-2, out=q)   # ±q
            return code.add_(s).view(-1)[:m]                # offset binary

        encode_blocks(n, plan.get("width"), out["codes"], step, codes, self.ws)

    def decoder(self, p: Payload, dtype: torch.dtype, scale: float) -> AffineDecoder:
        """``(code − s)·ν·scale/s`` per block of B elements."""
        s = p.plan.get("levels")
        return AffineDecoder(p.plan.get("width"), -float(s), p["norms"].to(dtype) * (scale / s),
                             block=self.params.bucket_size)


def rows_norm(rows: Tensor, mag: Tensor, work: Tensor) -> Tensor:
    """Euclidean norm of each row without overflow or underflow of the squares (scaled by the row's max |x|);
    ``mag`` holds ``|rows|``, ``work`` is scratch of the same shape."""
    m = mag.amax(dim=1)
    unit = torch.where(m > 0, m, torch.ones_like(m))
    return m * torch.linalg.vector_norm(torch.div(rows, unit[:, None], out=work), dim=1)


__all__ = ["QSGD", "QSGDParams", "code_width", "LEVELS_FOR_CF"]
