"""``sidco``: SIDCo's multi-stage exponential fit of the magnitudes to a threshold with the wanted density."""
from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, field_validator

from . import sparse_select as sel
from . import sparse_thresholds as thresholds
from .base import CompressCtx, TensorPlan
from .sparse import SparseCompressor, SparseParams, trim

Tensor = torch.Tensor


class SIDCoParams(SparseParams):
    first_ratio: float = Field(0.25, gt=0.0, lt=1.0)
    stage_ratio: float = Field(0.25, gt=0.0, lt=1.0)
    num_stages: int = Field(0, ge=0)
    distribution: Literal["exp"] = "exp"
    adapt_stages: bool = False

    @field_validator("adapt_stages")
    @classmethod
    def _no_adapt(cls, v: bool) -> bool:
        if v:
            raise ValueError("adapt_stages is not implemented (the fixed capacity already bounds the deviation)")
        return v


class SIDCo(SparseCompressor):
    """Multi-stage exponential fit of the magnitudes; thresholds on |x| (the ‖x‖ scaling cancels)."""

    name = "sidco"
    Params = SIDCoParams

    def ratios(self, level: float) -> list[float]:
        p = self.params
        return thresholds.sidco_ratios(min(1.0, 1.0 / level), p.first_ratio, p.stage_ratio, p.num_stages)

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        a = x.abs()
        thr = thresholds.sidco_threshold(a, self.ratios(plan.level), plan.k)
        return self.capacity(x, sel.candidates(a, thr, strict=True), plan.k, ctx.key)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        q = k2 / a1.numel()   # further stages on stage 1's exceedances, product of ratios = k2/m1
        stages = max(1, math.ceil(math.log(q) / math.log(self.params.stage_ratio) - 1e-12))
        ratios = [self.params.stage_ratio] * (stages - 1) + [q / self.params.stage_ratio ** (stages - 1)]
        return trim(a1, sel.candidates(a1, thresholds.sidco_threshold(a1, ratios, k2, m0_first=None), strict=True), k2)
