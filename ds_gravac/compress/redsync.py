"""``redsync``: RedSync's binary search of a magnitude threshold between the mean and the maximum |x|."""
from __future__ import annotations

import warnings

import torch
from pydantic import Field

from . import sparse_select as sel
from . import sparse_thresholds as thresholds
from .base import CompressCtx, TensorPlan
from .sparse import SparseCompressor, SparseParams, trim

Tensor = torch.Tensor


class RedSyncParams(SparseParams):
    search_eps: float = Field(0.2, gt=0.0, le=1.0)
    max_iters: int = Field(20, ge=1)


class RedSync(SparseCompressor):
    """Binary search of the threshold between mean and max |x|; deterministic, no randomness."""

    name = "redsync"
    Params = RedSyncParams
    _warned_low_cf = False     # set on the instance at the first warning

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        if level < 4 and not self._warned_low_cf:
            self._warned_low_cf = True
            warnings.warn(f"ds_gravac: redsync at CF {level:g} < 4 pads most payloads (its search never goes "
                          "below the mean magnitude)", stacklevel=3)
        return super().make_plan(numel, level)

    def _search(self, a: Tensor, k: int) -> Tensor:
        thr, _, _ = thresholds.redsync_threshold(a, k, self.params.search_eps, self.params.max_iters)
        return sel.candidates(a, thr, strict=True)

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        return self.capacity(x, self._search(x.abs(), plan.k), plan.k, ctx.key)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        return trim(a1, self._search(a1, k2), k2)
