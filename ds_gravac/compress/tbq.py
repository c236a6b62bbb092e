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
from .kinds import GainKind
from .memory import ResidualMemory
from .qkernels import chunk_size, encode_blocks
from .quantize import OwnMemoryQuantizer

Tensor = torch.Tensor


class TBQMemory(ResidualMemory):
    """TBQ's per-rank residual is its memory and its input (slot ``"r"`` in checkpoints)."""

    slots = ("r",)
    input_slot = "r"


class TBQParams(CompressorParams):
    tau: float = Field(0.5, gt=0.0)


class TBQ(OwnMemoryQuantizer):
    """±τ steps of a per-rank residual; the residual is the memory and the input slot."""

    name = "tbq"
    Params = TBQParams
    gain_kind = GainKind.PROJECTION
    GRID = (16.0,)
    Memory = TBQMemory

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return (Section("codes", torch.int32, bitpack.packed_words(numel, 2)),)

    def code_bits(self, plan: TensorPlan) -> int:
        return 2

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        tau = self.params.tau
        step = chunk_size()
        up, stay = self.scratch(x, step, "tbq_up", "tbq_stay")

        def codes(lo: int, hi: int) -> Tensor:   # 2 if x ≥ τ, 1 if −τ < x < τ, 0 if x ≤ −τ (NaN → 0)
            xc, m = x[lo:hi], hi - lo
            return torch.ge(xc, tau, out=up[:m]).add_(torch.gt(xc, -tau, out=stay[:m]))

        encode_blocks(x.numel(), 2, out["codes"], step, codes, self.ws)

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        """``(q − 1)·τ·scale``."""
        step = torch.tensor(self.params.tau, dtype=dtype, device=p.words.device) * scale
        return (torch.arange(4, dtype=dtype, device=p.words.device) - 1).mul_(step)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        moved = (bitpack.unpack(p["codes"], 2, p.plan.numel) != 1).sum().double()
        return moved * self.params.tau ** 2
