"""Packing of small unsigned codes into 32-bit words, shared by every quantizer.

Wire convention: codes of width ``b ∈ {1, 2, 4, 8, 16}`` bits are laid out LSB-first, element ``j`` at bit
``(j·b) mod 32`` of word ``floor(j·b/32)``; the unused tail bits of the last word are 0, so a payload is a pure
function of its codes (bitwise-reproducible buffers, nothing left over from a reused send buffer).

Why bytes: on a little-endian machine (every CPU and GPU PyTorch runs on in practice) byte ``k`` of a word
buffer holds bits ``8·(k mod 4) …`` of word ``k // 4``, so packing ``8/b`` codes per byte and writing the
bytes through a ``uint8`` view of the int32 words gives exactly the layout above. Packing views the one-byte
codes of a byte's group as a single wider integer (8 codes of 1 bit: an int64; 4 of 2 bits: an int32; 2 of 4
bits: an int16) and folds them into its low byte with shifts and ORs: a handful of vectorized integer operations
per byte, no per-bit strided passes, no temporaries wider than the codes.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from typing import Optional

import torch

Tensor = torch.Tensor
WIDTHS = (1, 2, 4, 8, 16)
# one byte's group of codes seen as one integer, and the right shifts that fold it into its low byte
_GROUP = {1: (torch.int64, (7, 14, 28)), 2: (torch.int32, (6, 12)), 4: (torch.int16, (4,))}
# the inverse: (left shift, mask) steps that spread a byte held in that integer over its bytes, one code each
_SPREAD = {1: ((28, 0x0000000F0000000F), (14, 0x0003000300030003), (7, 0x0101010101010101)),
           2: ((12, 0x000F000F), (6, 0x03030303)), 4: ((4, 0x0F0F),)}

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
    used = -(-count // per)
    grid = torch.zeros(used * per, dtype=torch.uint8, device=codes.device)
    grid[:count].copy_(codes)
    pack_bytes(grid, bits, out[:used], torch.empty_like(grid))
    out[used:].zero_()


def pack_bytes(codes: Tensor, bits: int, out: Tensor, work: Tensor) -> None:
    """Pack one-byte ``codes`` (a contiguous uint8 tensor of ``len(out)·8/bits`` codes, destroyed) into the uint8
    tensor ``out``, ``8/bits`` codes per byte, LSB first; ``work`` is scratch of ``codes``' size."""
    if bits == 8:
        out.copy_(codes)
        return
    dtype, shifts = _GROUP[bits]
    group = codes.view(dtype)
    tmp = work.view(dtype)
    for sh in shifts:   # code j of the group reaches bit j·bits of the low byte; higher bytes keep leftovers
        torch.bitwise_right_shift(group, sh, out=tmp)
        group.bitwise_or_(tmp)
    out.copy_(group)    # narrowing keeps the low byte


@lru_cache(maxsize=None)
def group_codes(bits: int, group: int, device: torch.device) -> Tensor:
    """``[2^(group·bits), group]`` int64: row ``i`` lists the ``group`` codes packed in the ``group·bits``-bit value
    ``i``, LSB first (the index of a table decode)."""
    _check_width(bits)
    if group * bits > 8:
        raise ValueError("ds_gravac: a table index spans at most one byte")
    i = torch.arange(1 << (group * bits), dtype=torch.int64)
    shifts = torch.arange(group, dtype=torch.int64) * bits
    return ((i[:, None] >> shifts) & ((1 << bits) - 1)).to(device)


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
            used = -(-count // per)
            grid = torch.empty(used * per, dtype=torch.uint8, device=words.device)
            unpack_bytes(raw[:used], bits, grid, torch.empty_like(grid))
            codes = grid[:count]
    if out is None:
        return codes.clone() if codes.data_ptr() == words.data_ptr() else codes
    out.copy_(codes)
    return out


def unpack_bytes(packed: Tensor, bits: int, out: Tensor, work: Tensor) -> None:
    """Inverse of :func:`pack_bytes`: the ``len(packed)·8/bits`` one-byte codes of the uint8 ``packed`` into the
    contiguous uint8 ``out``; ``work`` is scratch of ``out``'s size."""
    if bits == 8:
        out.copy_(packed)
        return
    dtype, _ = _GROUP[bits]
    group = out.view(dtype)
    tmp = work.view(dtype)
    group.copy_(packed)       # one packed byte per group, in its low byte
    for sh, mask in _SPREAD[bits]:
        torch.bitwise_left_shift(group, sh, out=tmp)
        group.bitwise_or_(tmp).bitwise_and_(mask)


def unpack_rows(rows: Tensor, bits: int, count: int) -> Tensor:
    """Codes of several equal-size packed sections at once: ``rows`` is ``[R, words]`` int32, the result
    ``[R, count]`` (one vectorized unpack for an owner's merge instead of one per rank)."""
    r, w = rows.shape
    if w != packed_words(count, bits):
        raise ValueError(f"ds_gravac: rows hold {w} words, {count} codes of {bits} bits need "
                         f"{packed_words(count, bits)}")
    flat = unpack(rows.contiguous().view(-1), bits, r * w * 32 // bits)
    return flat.view(r, -1)[:, :count]
