"""``graddrop``: GradDrop's sampled drop threshold, without adaptation or momentum correction."""
from __future__ import annotations

import math

import torch
from pydantic import Field

from . import sparse_select as sel
from .base import CompressCtx, TensorPlan
from .sparse import STREAM_GRADDROP_SAMPLE, SparseCompressor, SparseParams

Tensor = torch.Tensor


class GradDropParams(SparseParams):
    sample_ratio: float = Field(0.001, gt=0.0, le=1.0)


class GradDrop(SparseCompressor):
    """Sampled drop threshold, no adaptation, no momentum correction."""

    name = "graddrop"
    Params = GradDropParams

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        n = x.numel()
        s = max(1, math.ceil(self.params.sample_ratio * n))
        r = min(s, max(1, math.ceil(s / plan.level)))
        thr = sel.largest_at(sel.sample_abs(x, s, self.rank_generator(x, ctx, STREAM_GRADDROP_SAMPLE)), r)
        cand = sel.candidates(x, thr)
        return self.capacity(x, cand, plan.k, ctx.key)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        return self.sampled_stage2(a1, k2, self.params.sample_ratio, x, ctx)
