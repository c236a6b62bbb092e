"""``threshold``: a fixed magnitude threshold τ; the level only bounds the payload (static mode only)."""
from __future__ import annotations

import torch
from pydantic import Field

from . import sparse_select as sel
from .base import CompressCtx, TensorPlan
from .sparse import SparseCompressor, SparseParams

Tensor = torch.Tensor


class ThresholdParams(SparseParams):
    tau: float = Field(0.01, ge=0.0)


class Threshold(SparseCompressor):
    """Fixed magnitude threshold τ; θ only bounds the payload, so it is a static-mode compressor."""

    name = "threshold"
    Params = ThresholdParams
    static_only = True   # not usable with mode "gravac": its level does not steer the selection

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        cand = sel.candidates(x, self.params.tau, strict=True)
        return self.capacity(x, cand, plan.k, ctx.key)
