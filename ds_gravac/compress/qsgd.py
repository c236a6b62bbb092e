"""``qsgd``: stochastic quantization to ``s`` levels per block of ``B`` elements (QSGD).

The partition is cut into blocks of ``bucket_size`` B (a quantization block, unrelated to communication
buckets; the last block is zero-padded). Per block ``ν = ‖x_B‖₂`` and ``v_i = s·x_i/ν ∈ [−s, s]``; the code is
``⌊v_i + u_i⌋ ∈ [−s, s]`` with ``u_i`` uniform on ``[0, 1)`` (rank-local stream), i.e. ``v_i`` rounded to a
neighbouring integer with probability its distance to the other one — the paper's ``sign(x_i)·(⌊|v_i|⌋ +
Bernoulli(frac))`` in distribution, without separating sign and magnitude; ``ν = 0`` gives zero codes. Decode
``ν·code/s``: unbiased, with ``E‖D − x_B‖² ≤ min(B/s², √B/s)·‖x_B‖²``. Wire: ``norms: fp32[ceil(L/B)]`` + codes
in offset binary (``code + s``) at the smallest width ``w ∈ {2, 4, 8, 16}`` with ``2^w ≥ 2s + 1``. The level
picks s: θ ∈ {16, 8, 4} ↔ s ∈ {1, 7, 127} (w = 2, 4, 8); the ``levels`` parameter is the default level.

Cost. The draws are 15-bit (:func:`~ds_gravac.compress.qkernels.dither_`: a bias of at most 2^-16 of a level,
below the resolution an fp32 ``v + u`` keeps near ``|v| = 127``), and the encode is five passes over a block in
cache: the norms, ``s + x·s/ν + u``, floor, the pins, the packing.

Norms are computed in one fp32 pass, rescaled by the block max where the squares would overflow or underflow,
stored in fp32 (clamped to its maximum), and the stored value is what both encoder and decoder use, so
``|D_i − x_i| ≤ ν/s`` holds for the sent ν.
"""
from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from . import bitpack
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .kinds import GainKind
from .device_path import host_kernels
from .qkernels import AffineDecoder, chunk_size, dither_, encode_blocks
from .quantize import FP32_MAX, STREAM_QSGD, Quantizer, ceil_div

Tensor = torch.Tensor
LEVELS_FOR_CF = {16.0: 1, 8.0: 7, 4.0: 127}


def code_width(levels: int) -> int:
    """Smallest packable width holding the ``2s + 1`` offset-binary codes."""
    return next(w for w in bitpack.WIDTHS[1:] if (1 << w) >= 2 * levels + 1)


class QSGDParams(CompressorParams):
    levels: Literal[1, 7, 127] = 127
    bucket_size: int = Field(128, ge=1, le=1 << 20)
    error_feedback: bool = False


class QSGD(Quantizer):
    """Per-block L2-normalized stochastic quantization to ``s`` levels."""

    name = "qsgd"
    Params = QSGDParams
    gain_kind = GainKind.UNBIASED
    GRID = (4.0, 8.0, 16.0)

    def default_cf(self) -> float:
        return 32.0 / code_width(self.params.levels)

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        width = code_width(LEVELS_FOR_CF[theta])
        return (Section("norms", torch.float32, ceil_div(numel, self.params.bucket_size)),
                Section("codes", torch.int32, bitpack.packed_words(numel, width)))

    def plan_extra(self, theta: float) -> tuple[tuple[str, object], ...]:
        s = LEVELS_FOR_CF[theta]
        return (("levels", s), ("width", code_width(s)))

    def code_bits(self, plan: TensorPlan) -> int:
        return plan.get("width")

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        s = plan.get("levels")
        b, n = self.params.bucket_size, x.numel()
        norms = out["norms"]
        gen = self.stream(x, ctx, STREAM_QSGD, server)
        step = chunk_size(b)
        span = min(step, ceil_div(n, b) * b)
        pad, val = (self.ws.get(name, span, x.dtype, x.device) for name in ("qs_pad", "qs_val"))

        def codes(lo: int, hi: int) -> Tensor:
            m, r0 = hi - lo, lo // b
            r = ceil_div(m, b)
            xr = x[lo:hi]
            if r * b != m:                                   # the last block, zero-padded
                xr = pad[:r * b]
                xr[:m].copy_(x[lo:hi])
                xr[m:].zero_()
            xr = xr.view(r, b)
            nu = norms[r0:r0 + r]
            norms_of_rows, irregular = block_norms(xr)
            nu.copy_(norms_of_rows.clamp_(max=FP32_MAX))
            nu = nu.to(x.dtype)[:, None]                     # the stored values, as the decoder sees them
            u = dither_(gen, self.ws.get("qs_u", r * b, torch.float32, x.device), s, self.ws).view(r, b)
            q = torch.addcdiv(u, xr, nu, value=s, out=val[:r * b].view(r, b)).floor_()   # s + ⌊x·s/ν + u⌋
            if irregular:     # only a zero, tiny, huge or non-finite block can make 0/0 or ±inf (empty: code s)
                q.nan_to_num_(nan=s, posinf=2 * s, neginf=0)
            q.clamp_(0, 2 * s)
            return q.view(-1)[:m]                           # offset binary

        encode_blocks(n, plan.get("width"), out["codes"], step, codes, self.ws)

    def decoder(self, p: Payload, dtype: torch.dtype, scale: float) -> AffineDecoder:
        """``(code − s)·ν·scale/s`` per block of B elements."""
        s = p.plan.get("levels")
        return AffineDecoder(p.plan.get("width"), -float(s), p["norms"].to(dtype) * (scale / s),
                             block=self.params.bucket_size)


def block_norms(rows: Tensor) -> tuple[Tensor, bool]:
    """Euclidean norm of each row, and whether any row was irregular. One fp32 pass where the squares neither
    overflow nor underflow; the rows whose norm falls outside ``[2^-60, 2^60]`` (zero, tiny, huge or non-finite)
    are recomputed scaled by their max |x|. Whether any is would be one host synchronization per block on an
    accelerator, so the device path computes the scaled norm of every row (two more passes over the block) and
    reports the block irregular (the encoder's NaN/inf pass then changes nothing on regular rows). With every row regular, ``|x_i|·s/ν ≤ s`` is finite: the encoder skips its NaN/inf pass."""
    nu = torch.linalg.vector_norm(rows, dim=1)
    odd = torch.logical_not((nu >= SAFE_LO) & (nu <= SAFE_HI))
    if not host_kernels(rows):      # the device path: every row's scaled norm, kept where irregular; no host read
        m = rows.abs().amax(dim=1)
        unit = torch.where(m > 0, m, torch.ones_like(m))
        return torch.where(odd, m * torch.linalg.vector_norm(rows / unit[:, None], dim=1), nu), True
    if bool(odd.any()):
        idx = odd.nonzero().view(-1)
        sub = rows.index_select(0, idx)
        m = sub.abs().amax(dim=1)
        unit = torch.where(m > 0, m, torch.ones_like(m))
        nu.index_copy_(0, idx, m * torch.linalg.vector_norm(sub.div_(unit[:, None]), dim=1))
        return nu, True
    return nu, False


SAFE_LO, SAFE_HI = 2.0 ** -60, 2.0 ** 60


__all__ = ["QSGD", "QSGDParams", "code_width", "LEVELS_FOR_CF"]
