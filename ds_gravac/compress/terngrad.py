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

from typing import Literal

import torch

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .kinds import GainKind
from .qkernels import chunk_size, encode_blocks
from .quantize import FP32_MAX, STREAM_TERNGRAD, Quantizer, put_header, theta_bits

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
    gain_kind = GainKind.UNBIASED
    GRID = (4.0, 8.0, 16.0, 32.0)

    def default_cf(self) -> float:
        return 32.0 / self.params.bits

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        bits = theta_bits(theta)
        return (Section("range", torch.float32, 2), Section("codes", torch.int32, bitpack.packed_words(numel, bits)))

    def plan_extra(self, theta: float) -> tuple[tuple[str, object], ...]:
        return (("bits", theta_bits(theta)),)

    def code_bits(self, plan: TensorPlan) -> int:
        return plan.get("bits")

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        bits = plan.get("bits")
        top = (1 << bits) - 1
        lo_x, hi_x = torch.aminmax(x)
        put_header(out["range"], lo_x, hi_x)
        rng = out["range"].to(x.dtype)             # the stored fp32 values, as the decoder sees them
        lo, hi = rng[0], rng[1]
        gap = _gap(lo, hi, top)
        # gap = 0 sends zeros: an infinite step makes every (x − lo)/gap zero and no x reaches the pin at hi.
        # Otherwise x = lo gives 0 exactly (x/2 − lo/2 = 0) and x < lo a negative value the clamp lifts to 0
        flat = gap == 0
        neg_half_lo = lo * -0.5
        half_gap = torch.where(flat, float("inf"), gap * 0.5)
        pin_at = torch.where(flat, float("inf"), hi)
        pin = torch.tensor(top + 1.0, dtype=x.dtype, device=x.device)
        gen = self.stream(x, ctx, STREAM_TERNGRAD, server) if self.params.stochastic else None
        step = chunk_size()
        val, mask = self.scratch(x, step, "tg_val", "tg_mask")

        def codes(a: int, b: int) -> Tensor:
            xc, m = x[a:b], b - a
            v = torch.mul(xc, 0.5, out=val[:m]).add_(neg_half_lo)   # halves: x − lo may exceed fp32
            if gen is None:
                v.div_(half_gap).add_(0.5)
            else:
                torch.addcdiv(self.draws(gen, m, x.device), v, half_gap, out=v)
            v.floor_()                                              # ⌊(x − lo)/gap + u⌋
            v.addcmul_(torch.ge(xc, pin_at, out=mask[:m]), pin)     # x ≥ hi → top, once clamped
            return v.nan_to_num_(0.0).clamp_(0, top)

        encode_blocks(x.numel(), bits, out["codes"], step, codes, self.ws)

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        top = (1 << p.plan.get("bits")) - 1
        rng = p["range"].to(dtype)
        lo, hi = rng[0], rng[1]
        q = torch.arange(top + 1, dtype=dtype, device=p.words.device)
        half_gap = _gap(lo, hi, top) * 0.5
        vals = torch.where(q == top, hi, (q * half_gap).add_(lo * 0.5).mul_(2.0))
        return vals.mul_(scale) if scale != 1.0 else vals
