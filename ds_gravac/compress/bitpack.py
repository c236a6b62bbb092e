"""Packing of small unsigned codes into 32-bit words, shared by every quantizer.

Wire convention: codes of width ``b ∈ {1, 2, 4, 8, 16}`` bits are laid out LSB-first, element ``j`` at bit
``(j·b) mod 32`` of word ``floor(j·b/32)``; the unused tail bits of the last word are 0, so a payload is a pure
function of its codes (bitwise-reproducible buffers, nothing left over from a reused send buffer).

Why bytes: on a little-endian machine (every CPU and GPU PyTorch runs on in practice) byte ``k`` of a word
buffer holds bits ``8·(k mod 4) …`` of word ``k // 4``, so packing ``8/b`` codes per byte and writing the
bytes through a ``uint8`` view of the int32 words gives exactly the layout above. Temporaries are one byte per
code (never int64), and the Python loops run over the ``≤ 8`` bit positions of a byte, never over elements.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

Tensor = torch.Tensor
WIDTHS = (1, 2, 4, 8, 16)

if sys.byteorder != "little":   # pragma: no cover - no supported platform is big-endian
    raise ImportError("ds_gravac.compress.bitpack assumes a little-endian byte order")


def packed_words(count: int, bits: int) -> int:
    """32-bit words holding ``count`` codes of ``bits`` bits: ``ceil(count·bits/32)``."""
    _check_width(bits)
    return (count * bits + 31) // 32


def _check_width(bits: int) -> None:
    if bits not in WIDTHS:
        raise ValueError(f"ds_gravac: code width must be one of {WIDTHS}, got {bits}")


def _check_words(words: Tensor, count: int, bits: int) -> None:
    need = packed_words(count, bits)
    if words.dtype != torch.int32 or words.dim() != 1 or words.numel() != need or not words.is_contiguous():
        raise ValueError(f"ds_gravac: expected a contiguous 1-D int32 view of {need} words for {count} codes of "
                         f"{bits} bits, got {words.dtype} of shape {tuple(words.shape)}")


def pack(codes: Tensor, bits: int, words: Tensor) -> None:
    """Write ``codes`` (integers in ``[0, 2^bits)``, any integer or bool dtype) into the int32 view ``words``.

    Values outside the range are not checked (the caller quantized them); their excess bits would leak into
    the neighbours' fields, so encoders clamp before packing.
    """
    codes = codes.reshape(-1)
    count = codes.numel()
    _check_words(words, count, bits)
    if bits == 16:
        half = words.view(torch.int16)
        # int16 has no unsigned twin with full op support: store c − 2^16 for c ≥ 2^15 (same bit pattern)
        c = codes.to(torch.int32)
        half[:count].copy_(torch.where(c >= 32768, c - 65536, c))
        half[count:].zero_()
        return
    out = words.view(torch.uint8)
    per = 8 // bits
    if per == 1:
        out[:count].copy_(codes)
        out[count:].zero_()
        return
    grid = torch.zeros(out.numel() * per, dtype=torch.uint8, device=codes.device)
    grid[:count].copy_(codes)
    grid = grid.view(-1, per)
    out.copy_(grid[:, 0])
    for j in range(1, per):   # bit positions within a byte, not elements
        out.bitwise_or_(grid[:, j].bitwise_left_shift(j * bits))


def unpack(words: Tensor, bits: int, count: int, out: Optional[Tensor] = None) -> Tensor:
    """The ``count`` codes held in ``words``: uint8 for widths ≤ 8, int32 for 16 (written into ``out`` if given,
    which may be any integer or floating tensor of ``count`` elements)."""
    _check_words(words, count, bits)
    if bits == 16:
        codes = words.view(torch.int16)[:count].to(torch.int32).bitwise_and_(0xFFFF)
    else:
        raw = words.view(torch.uint8)
        per = 8 // bits
        if per == 1:
            codes = raw[:count]
        else:
            mask = (1 << bits) - 1
            grid = torch.empty(raw.numel(), per, dtype=torch.uint8, device=words.device)
            for j in range(per):
                torch.bitwise_and(raw.bitwise_right_shift(j * bits), mask, out=grid[:, j])
            codes = grid.view(-1)[:count]
    if out is None:
        return codes.clone() if codes.data_ptr() == words.data_ptr() else codes
    out.copy_(codes)
    return out


def unpack_rows(rows: Tensor, bits: int, count: int) -> Tensor:
    """Codes of several equal-size packed sections at once: ``rows`` is ``[R, words]`` int32, the result
    ``[R, count]`` (one vectorized unpack for an owner's merge instead of one per rank)."""
    r, w = rows.shape
    if w != packed_words(count, bits):
        raise ValueError(f"ds_gravac: rows hold {w} words, {count} codes of {bits} bits need "
                         f"{packed_words(count, bits)}")
    flat = unpack(rows.contiguous().view(-1), bits, r * w * 32 // bits)
    return flat.view(r, -1)[:, :count]
