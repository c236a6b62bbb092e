"""Shared base of the half-precision casts ``fp16`` and ``bf16`` (summable, θ = 2).

Each rank sends ``y = cast(x/N)``; the payloads are all-reduced (SUM) in the half dtype and the result is the
average ``G = fp32(Σ_w y_w)``. Pre-dividing by the world size keeps the N-way half-precision sum from overflowing
(as PyTorch's fp16 communication hook does). In the contract's terms one payload decodes to
``D(p) = N·fp32(y)``, so the synchronizer's ``scale = 1/N`` on the reduced payload gives back ``fp32(Σ y)`` and the
optional error feedback is ``r = x − N·fp32(y)``.

Saturation: ``x/N`` is clamped to the largest half value ``v`` with ``N·v`` ≤ the dtype's maximum, so a finite
input never produces an infinity, neither in one payload nor in the reduced sum (every partial sum of a ring
all-reduce stays ≤ N·v and rounds to a finite value). For fp16 and ``|x| ≤ 65504`` nothing is clamped when N = 1.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import ClassVar, Optional

import torch

from .base import CompressCtx, Compressor, CompressorParams, Kind, Payload, Section, TensorPlan
from .kinds import GainKind, LevelKind, Multilevel
from .qkernels import Workspace, chunk_size, spans
from .memory import SwitchedErrorFeedback
from .quantize import emit

Tensor = torch.Tensor
VALUES = "val"


class CastParams(CompressorParams):
    error_feedback: bool = False


@lru_cache(maxsize=None)
def saturation(dtype: torch.dtype, world_size: int) -> float:
    """Largest ``v`` of ``dtype`` with ``world_size·v ≤ finfo(dtype).max`` (exact: half values times a small
    integer are exact in double)."""
    top = torch.finfo(dtype).max
    v = torch.tensor(top / world_size, dtype=torch.float64).to(dtype)
    bits = v.view(torch.int16)
    while float(v) * world_size > top:   # at most a step or two: walk down one representable value at a time
        bits = bits - 1
        v = bits.view(dtype)
    return float(v)


def world(ctx: Optional[CompressCtx]) -> int:
    if ctx is None:
        raise ValueError("ds_gravac: half-precision decode needs ctx (payloads are pre-divided by the world size)")
    return max(1, int(ctx.world_size))


class HalfCast(Compressor):
    """``y = cast(x/N)``; subclasses set :attr:`dtype`."""

    kind = Kind.SUMMABLE
    exchange = "half_allreduce"     # summed in the half dtype itself (ds_gravac.sync.exchange.allreduce)
    Params = CastParams
    multilevel = Multilevel.NONE
    gain_kind = GainKind.NONE
    level_kind = LevelKind.CF
    dtype: ClassVar[torch.dtype] = torch.float16
    Memory = SwitchedErrorFeedback     # external EF ``r = x − N·fp32(y)`` when enabled, zeros when off

    def __init__(self, params: Optional[CompressorParams] = None) -> None:
        super().__init__(params)
        self.ws = Workspace()

    def cf_grid(self) -> Optional[list[float]]:
        return [2.0]

    def default_cf(self) -> float:
        return 2.0

    @property
    def worker_error_feedback(self) -> bool:
        return bool(self.params.error_feedback)

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        return TensorPlan(numel, 2.0, numel, (Section(VALUES, self.dtype, numel),), values_sent=numel)

    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        x = x.detach().reshape(-1)
        n = world(ctx)
        v = saturation(self.dtype, n)
        words = out.words[plan.offset_of(VALUES):][:plan.sections[0].words]
        full = words.view(self.dtype)               # includes the pad half of an odd count: written as 0
        full[:x.numel()].copy_((x / n).clamp_(-v, v))
        full[x.numel():].zero_()
        if update_state:
            self.memory.commit(x, out, ctx)
        return None

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        factor = scale * world(ctx)
        if math.isclose(factor, 1.0, rel_tol=1e-12):   # the reduced payload at scale 1/N: G = fp32(Σ y) exactly
            factor = 1.0
        y = p[VALUES]
        if factor == 1.0 and not accumulate:      # the reduced payload: one cast straight into the output
            out.copy_(y)
            return
        step = chunk_size()                       # otherwise through a cached block, not a decoded temporary
        buf = self.ws.get("cast", min(step, y.numel()), out.dtype, out.device)
        for lo, hi in spans(y.numel(), step):
            vals = buf[:hi - lo].copy_(y[lo:hi])
            emit(out[lo:hi], vals.mul_(factor) if factor != 1.0 else vals, accumulate)
