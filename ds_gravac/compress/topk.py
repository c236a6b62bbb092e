"""``topk``: exact top-k of |x| per tensor (sampled low threshold, one candidate pass, exact selection)."""
from __future__ import annotations

from typing import Literal, Optional

import torch

from . import sparse_select as sel
from .base import CompressCtx, TensorPlan
from .kinds import Multilevel
from .sparse import STREAM_TOPK_SAMPLE, SparseCompressor, SparseParams

Tensor = torch.Tensor


class TopKParams(SparseParams):
    algorithm: Literal["auto", "topk", "kthvalue", "sort"] = "auto"


class TopK(SparseCompressor):
    """Exact top-k of |x|. ``auto``: sampled low threshold, one candidate pass, exact selection."""

    name = "topk"
    Params = TopKParams
    multilevel = Multilevel.EXACT

    def select_entries(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> tuple[Tensor, Optional[Tensor]]:
        n, k, alg = x.numel(), plan.k, self.params.algorithm
        if alg == "auto":
            big = n >= sel.SMALL_N and k <= n // 4
            return sel.exact_topk(x, k, self.rank_generator(x, ctx, STREAM_TOPK_SAMPLE) if big else None)
        if k >= n:
            return torch.arange(n, device=x.device), None
        fn = {"topk": sel.topk_torch, "kthvalue": sel.topk_kthvalue, "sort": sel.topk_sort}[alg]
        return fn(x.abs(), k), None
