"""``tbq``: threshold binary quantization with a residual (Strom's 2-bit scheme, HiPress "TBQ").

Each rank keeps its own residual ``r`` (memory slot ``r``, fp32, per bucket element): ``r ← r + g``; an element
whose residual reached ``τ`` sends code 2 (``+τ``) and keeps ``r − τ``, one at or below ``−τ`` sends 0 (``−τ``) and
keeps ``r + τ``, every other one sends 1 (nothing). So at most ``±τ`` per element moves per step and the rest waits
in r: ``r_new = r_old + g − D(p)`` exactly. Payload: 2-bit codes only (τ is configuration), θ = 16. The owner
applies the same thresholding to its merged partition, with its server residual. Gain: ``‖D(p)‖² = τ²·#{q ≠ 1}``
never exceeds ``‖r + g‖²``, so it behaves like a projection.
"""
from __future__ import annotations

from typing import Optional

import torch
from pydantic import Field

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .quantize import OwnMemoryQuantizer, emit

Tensor = torch.Tensor


class TBQParams(CompressorParams):
    tau: float = Field(0.5, gt=0.0)


class TBQ(OwnMemoryQuantizer):
    """±τ steps of a per-rank residual; the residual is the memory and the input slot."""

    name = "tbq"
    Params = TBQParams
    gain_kind = "projection"
    GRID = (16.0,)
    memory_slots = ("r",)
    input_slot = "r"

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return (Section("codes", torch.int32, bitpack.packed_words(numel, 2)),)

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        tau = self.params.tau
        up = (x >= tau).to(torch.uint8)
        stay = (x > -tau).to(torch.uint8)
        bitpack.pack(up + stay, 2, out["codes"])      # 2 if x ≥ τ, 1 if −τ < x < τ, 0 if x ≤ −τ (NaN → 0)

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        q = bitpack.unpack(p["codes"], 2, p.plan.numel)
        step = torch.tensor(self.params.tau, dtype=out.dtype, device=out.device) * scale
        emit(out, (q.to(out.dtype) - 1).mul_(step), accumulate)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        moved = (bitpack.unpack(p["codes"], 2, p.plan.numel) != 1).sum().double()
        return moved * self.params.tau ** 2
