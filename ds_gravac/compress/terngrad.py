"""``terngrad``: b-bit min/max quantization (the HiPress form of TernGrad).

Per partition ``lo = min x``, ``hi = max x`` and ``gap = (hi − lo)/(2^b − 1)``; element i sends
``q_i = floor((x_i − lo)/gap + u_i)`` with ``u_i ~ U[0, 1)`` from the rank-local stream (unbiased stochastic
rounding; ``stochastic = false`` rounds to nearest), clamped to ``[0, 2^b − 1]``, and decodes to
``lo + q_i·gap``. The extremes are pinned (``x = lo`` → 0, ``x = hi`` → top code, decoded as ``hi`` itself), so
they survive exactly whatever the rounding of ``gap``. ``gap = 0`` (a constant partition) sends all-zero codes.
Payload: ``range: fp32[2] = [lo, hi]`` + codes packed at ``b`` bits. The level picks b: θ ∈ {32, 16, 8, 4} for
b = 1, 2, 4, 8; the ``bits`` parameter is the default level (:meth:`TernGrad.default_cf`).

Both sides derive ``gap`` from the stored fp32 ``lo, hi`` as ``hi/t − lo/t`` (clamped to the fp32 maximum), and
work with halved operands (``(x/2 − lo/2)/(gap/2)``, ``2·(lo/2 + q·gap/2)``: bitwise the plain formulas for normal
numbers), so a partition whose range exceeds the fp32 maximum still encodes and decodes to finite values.
"""
from __future__ import annotations

from typing import Literal, Optional

import torch

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .quantize import (FP32_MAX, STREAM_TERNGRAD, Quantizer, as_compute, codes_from, emit, put_header,
                       stochastic_floor, theta_bits)

Tensor = torch.Tensor


class TernGradParams(CompressorParams):
    bits: Literal[1, 2, 4, 8] = 2
    stochastic: bool = True
    error_feedback: bool = False


def _gap(lo: Tensor, hi: Tensor, top: int) -> Tensor:
    """The level spacing, computed identically by encoder and decoder (see the module docstring)."""
    return (hi / top - lo / top).clamp(max=FP32_MAX)


class TernGrad(Quantizer):
    """Unbiased b-bit uniform quantization between the partition's min and max."""

    name = "terngrad"
    Params = TernGradParams
    gain_kind = "unbiased"
    GRID = (4.0, 8.0, 16.0, 32.0)

    def default_cf(self) -> float:
        return 32.0 / self.params.bits

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        bits = theta_bits(theta)
        return (Section("range", torch.float32, 2), Section("codes", torch.int32, bitpack.packed_words(numel, bits)))

    def plan_extra(self, theta: float) -> tuple[tuple[str, object], ...]:
        return (("bits", theta_bits(theta)),)

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        bits = plan.get("bits")
        top = (1 << bits) - 1
        lo_x, hi_x = torch.aminmax(x)
        put_header(out["range"], lo_x, hi_x)
        rng = as_compute(out["range"], x)          # the stored fp32 values, as the decoder sees them
        lo, hi = rng[0], rng[1]
        gap = _gap(lo, hi, top)
        u = self.uniform(x, ctx, STREAM_TERNGRAD, server) if self.params.stochastic else None
        v = stochastic_floor((x * 0.5 - lo * 0.5) / (gap * 0.5), u)   # halves: x − lo may exceed fp32
        v = torch.where(x >= hi, float(top), v)
        v = torch.where((x <= lo) | (gap == 0), 0.0, v)
        bitpack.pack(codes_from(v, top), bits, out["codes"])

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        bits = p.plan.get("bits")
        top = (1 << bits) - 1
        rng = as_compute(p["range"], out)
        lo, hi = rng[0], rng[1]
        q = bitpack.unpack(p["codes"], bits, p.plan.numel)
        half_gap = _gap(lo, hi, top) * 0.5
        vals = torch.where(q == top, hi, (q.to(out.dtype) * half_gap).add_(lo * 0.5).mul_(2.0))
        emit(out, vals.mul_(scale) if scale != 1.0 else vals, accumulate)
