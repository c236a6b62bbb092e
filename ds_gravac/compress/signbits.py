"""The ±1 sign-bit path shared by ``onebit``, ``signsgd`` and ``efsignsgd``.

One bit per element, ``1`` for ``x ≥ 0`` (zero counts as positive, so an all-zero input and a tied vote both
encode as +1), decoded as one of two levels. The levels come from a small fp32 header — ``[s]`` for
``±s`` (mean-abs scaling), ``[μ+, μ−]`` for two means — or are the constants ±1 (signSGD, no header).
"""
from __future__ import annotations

from typing import Sequence

import torch

from . import bitpack
from .base import Payload, Section
from .quantize import as_compute, emit, mean_abs, put_header

Tensor = torch.Tensor
BITS = "bits"
SCALE = "scale"


def sections(numel: int, header: int) -> tuple[Section, ...]:
    """``scale: fp32[header]`` (omitted when 0) then ``bits: int32[ceil(numel/32)]``."""
    bits = Section(BITS, torch.int32, bitpack.packed_words(numel, 1))
    return (Section(SCALE, torch.float32, header), bits) if header else (bits,)


def encode_signs(x: Tensor, out: Payload) -> Tensor:
    """Pack ``x ≥ 0`` into the payload's bit section; returns the boolean mask (reused for two means)."""
    pos = x >= 0
    bitpack.pack(pos, 1, out[BITS])
    return pos


def signs(p: Payload) -> Tensor:
    """The payload's sign bits as a boolean tensor of ``numel`` elements."""
    return bitpack.unpack(p[BITS], 1, p.plan.numel).bool()


def decode_levels(p: Payload, neg: Tensor | float, pos: Tensor | float, out: Tensor, accumulate: bool,
                  scale: float) -> None:
    """``out (+)= scale · (b ? pos : neg)``; levels are scaled once, so every decoded value is one of two."""
    dt = out.dtype
    lo = torch.as_tensor(neg, dtype=dt, device=out.device) * scale
    hi = torch.as_tensor(pos, dtype=dt, device=out.device) * scale
    emit(out, torch.where(signs(p), hi, lo), accumulate)


# ---- mean-abs scaling (onebit default, efsignsgd) ---------------------------------------------------------
def encode_mean_abs(x: Tensor, out: Payload) -> None:
    """``s = ‖x‖₁/L`` and the sign bits: decodes to ``±s``, preserving ‖x‖₁."""
    put_header(out[SCALE], mean_abs(x))
    encode_signs(x, out)


def decode_mean_abs(p: Payload, out: Tensor, accumulate: bool, scale: float) -> None:
    s = as_compute(p[SCALE][0], out)
    decode_levels(p, -s, s, out, accumulate, scale)


def mean_abs_sq_norm(p: Payload) -> Tensor:
    """``‖D(p)‖² = L·s²`` without decoding."""
    return p[SCALE][0].double().square() * p.plan.numel


# ---- two means (onebit's GRACE form) -----------------------------------------------------------------------
def encode_two_means(x: Tensor, out: Payload) -> None:
    """``μ+`` = mean of the non-negative entries, ``μ−`` = mean of the negative ones (0 for an empty set), so
    ``#pos·μ+ + #neg·μ− = Σx``; sums in float64 so a finite input gives finite means."""
    pos = encode_signs(x, out)
    n_pos = pos.sum()
    n_neg = x.numel() - n_pos
    s_pos = torch.where(pos, x, 0).sum(dtype=torch.float64)
    s_neg = torch.where(pos, 0, x).sum(dtype=torch.float64)
    put_header(out[SCALE], s_pos / n_pos.clamp(min=1), s_neg / n_neg.clamp(min=1))


def decode_two_means(p: Payload, out: Tensor, accumulate: bool, scale: float) -> None:
    hdr = as_compute(p[SCALE], out)
    decode_levels(p, hdr[1], hdr[0], out, accumulate, scale)


def two_means_sq_norm(p: Payload) -> Tensor:
    n_pos = signs(p).sum().double()
    hdr = p[SCALE].double()
    return n_pos * hdr[0].square() + (p.plan.numel - n_pos) * hdr[1].square()


# ---- majority vote (signsgd's owner) --------------------------------------------------------------------------
def vote_count(payloads: Sequence[Payload], out: Tensor) -> None:
    """``out = v = Σ_w (2·b_w − 1)``: every rank's bits unpacked in one pass, counted in int32 (exact)."""
    numel = payloads[0].plan.numel
    rows = torch.stack([p[BITS] for p in payloads])
    ones = bitpack.unpack_rows(rows, 1, numel).sum(dim=0, dtype=torch.int32)
    out.copy_(ones * 2 - len(payloads))
