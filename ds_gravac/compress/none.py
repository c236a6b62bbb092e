"""``none``: the dense reference. The synchronizer routes every tensor of a ``none`` run through the
DeepSpeed-exact dense all-reduce, so this class only declares the contract."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .base import CompressCtx, Compressor, Kind, Payload, Section, TensorPlan
from .kinds import GainKind


class NoCompression(Compressor):
    """θ = 1; bit-identical to DeepSpeed's data-parallel averaging because it is sent on the dense path."""

    name = "none"
    kind = Kind.SUMMABLE
    gain_kind = GainKind.PROJECTION

    def accepts(self, shape: Sequence[int]) -> bool:
        return False

    def cf_grid(self) -> Optional[list[float]]:
        return [1.0]

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        return TensorPlan(numel, 1.0, numel, (Section("val", torch.float32, numel),), numel)

    def compress(self, x: torch.Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[torch.Tensor]:
        out["val"].copy_(x)
        if update_state and ctx.residual is not None:
            ctx.residual.zero_()
        return None

    def decompress(self, p: Payload, out: torch.Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        if accumulate:
            out.add_(p["val"], alpha=scale)
        else:
            torch.mul(p["val"], scale, out=out)
