"""The ±1 sign-bit path shared by ``onebit``, ``signsgd`` and ``efsignsgd``.

One bit per element, ``1`` for ``x ≥ 0`` (zero counts as positive, so an all-zero input and a tied vote both
encode as +1), decoded as one of two levels. The levels come from a small fp32 header — ``[s]`` for
``±s`` (mean-abs scaling), ``[μ+, μ−]`` for two means — or are the constants ±1 (signSGD, no header).

Encoding is one sweep of cache-sized blocks (``ds_gravac.compress.qkernels``): each block's sign flags are packed
and its contribution to the header's float64 sums is taken while the block is in cache. Decoding gathers from a
``[256, 8]`` table of the two levels (:meth:`ds_gravac.compress.quantize.Quantizer.decode_sum`).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import bitpack
from .base import Payload, Section
from .qkernels import Workspace, chunk_size, encode_blocks, sum64
from .quantize import put_header

Tensor = torch.Tensor
BITS = "bits"
SCALE = "scale"
# per block: (x block, its sign flags as 1.0/0.0, a scratch block) → contributions to the header sums
Stats = Callable[[Tensor, Tensor, Tensor], None]


def sections(numel: int, header: int) -> tuple[Section, ...]:
    """``scale: fp32[header]`` (omitted when 0) then ``bits: int32[ceil(numel/32)]``."""
    bits = Section(BITS, torch.int32, bitpack.packed_words(numel, 1))
    return (Section(SCALE, torch.float32, header), bits) if header else (bits,)


def encode_signs(x: Tensor, out: Payload, ws: Workspace, stats: Optional[Stats] = None) -> None:
    """Pack ``x ≥ 0`` into the payload's bit section, calling ``stats`` on every block on the way."""
    step = chunk_size()
    flags = ws.get("sb_flags", min(step, x.numel()), x.dtype, x.device)
    work = ws.get("sb_work", min(step, x.numel()), x.dtype, x.device)

    def codes(lo: int, hi: int) -> Tensor:
        xc, f = x[lo:hi], flags[:hi - lo]
        torch.ge(xc, 0, out=f)
        if stats is not None:
            stats(xc, f, work[:hi - lo])
        return f

    encode_blocks(x.numel(), 1, out[BITS], step, codes, ws)


def signs(p: Payload) -> Tensor:
    """The payload's sign bits as a boolean tensor of ``numel`` elements."""
    return bitpack.unpack(p[BITS], 1, p.plan.numel).bool()


def levels(neg: Tensor | float, pos: Tensor | float, dtype: torch.dtype, device: torch.device,
           scale: float) -> Tensor:
    """``[neg, pos]·scale`` in ``dtype``: each level scaled once, so every decoded value is one of the two."""
    lo = torch.as_tensor(neg, dtype=dtype, device=device) * scale
    hi = torch.as_tensor(pos, dtype=dtype, device=device) * scale
    return torch.stack([lo.reshape(()), hi.reshape(())])


# ---- mean-abs scaling (onebit default, efsignsgd) ---------------------------------------------------------
def encode_mean_abs(x: Tensor, out: Payload, ws: Workspace) -> None:
    """``s = ‖x‖₁/L`` (accumulated in float64: finite for any finite input) and the sign bits: decodes to ``±s``,
    preserving ‖x‖₁."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)

    def l1(xc: Tensor, f: Tensor, work: Tensor) -> None:
        total.add_(sum64(torch.abs(xc, out=work), ws))

    encode_signs(x, out, ws, l1)
    put_header(out[SCALE], total / x.numel())


def mean_abs_levels(p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
    s = p[SCALE][0].to(dtype)
    return levels(-s, s, dtype, p.words.device, scale)


def mean_abs_sq_norm(p: Payload) -> Tensor:
    """``‖D(p)‖² = L·s²`` without decoding."""
    return p[SCALE][0].double().square() * p.plan.numel


# ---- two means (onebit's GRACE form) -----------------------------------------------------------------------
def encode_two_means(x: Tensor, out: Payload, ws: Workspace) -> None:
    """``μ+`` = mean of the non-negative entries, ``μ−`` = mean of the negative ones (0 for an empty set), so
    ``#pos·μ+ + #neg·μ− = Σx``; sums in float64 so a finite input gives finite means. Per block the parts are
    ``max(x, 0)`` (NaN counted as negative, as ``x ≥ 0`` does) and ``min(x, 0)``."""
    acc = torch.zeros(3, dtype=torch.float64, device=x.device)     # #pos, Σ pos, Σ neg
    inf = float("inf")

    def split(xc: Tensor, f: Tensor, work: Tensor) -> None:
        acc[0].add_(sum64(f, ws))
        acc[1].add_(sum64(torch.clamp(xc, min=0, out=work).nan_to_num_(0.0, posinf=inf, neginf=-inf), ws))
        acc[2].add_(sum64(torch.clamp(xc, max=0, out=work), ws))

    encode_signs(x, out, ws, split)
    n_pos = acc[0]
    put_header(out[SCALE], acc[1] / n_pos.clamp(min=1), acc[2] / (x.numel() - n_pos).clamp(min=1))


def two_means_levels(p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
    hdr = p[SCALE].to(dtype)
    return levels(hdr[1], hdr[0], dtype, p.words.device, scale)


def two_means_sq_norm(p: Payload) -> Tensor:
    n_pos = signs(p).sum().double()
    hdr = p[SCALE].double()
    return n_pos * hdr[0].square() + (p.plan.numel - n_pos) * hdr[1].square()
