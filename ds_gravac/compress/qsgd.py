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

from typing import Literal, Optional

import torch
from pydantic import Field

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .quantize import (FP32_MAX, STREAM_QSGD, Quantizer, as_compute, ceil_div, codes_from, emit, safe_rows_norm,
                       stochastic_floor)

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

    def _blocks(self, x: Tensor) -> Tensor:
        """``x`` as ``[blocks, B]`` rows, the last one zero-padded (a view when no padding is needed)."""
        b = self.params.bucket_size
        nb = ceil_div(x.numel(), b)
        if nb * b == x.numel():
            return x.view(nb, b)
        rows = x.new_zeros(nb * b)
        rows[:x.numel()].copy_(x)
        return rows.view(nb, b)

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        s, width = plan.get("levels"), plan.get("width")
        rows = self._blocks(x)
        out["norms"].copy_(safe_rows_norm(rows).clamp(max=FP32_MAX))
        nu = as_compute(out["norms"], x)[:, None]
        u = self.uniform(x, ctx, STREAM_QSGD, server, count=rows.numel()).view_as(rows)
        level = stochastic_floor(rows.abs() * s / nu, u)
        q = codes_from(torch.where(nu > 0, level, 0.0), s)        # NaN/inf positions (non-finite input) → 0
        code = torch.where(rows < 0, -q, q).add_(s).view(-1)[:x.numel()]
        bitpack.pack(code, width, out["codes"])

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        s, width, n = p.plan.get("levels"), p.plan.get("width"), p.plan.numel
        b = self.params.bucket_size
        nb = p["norms"].numel()
        step = as_compute(p["norms"], out) * (scale / s)
        code = torch.zeros(nb * b, dtype=out.dtype, device=out.device)
        bitpack.unpack(p["codes"], width, n, out=code[:n])
        vals = (code.view(nb, b) - s).mul_(step[:, None]).view(-1)[:n]
        emit(out, vals, accumulate)


__all__ = ["QSGD", "QSGDParams", "code_width", "LEVELS_FOR_CF"]
