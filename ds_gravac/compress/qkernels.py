"""Cache-blocked kernels shared by the quantizers: encode and decode a partition in few memory passes.

Why blocks. In eager PyTorch every operation over a partition is a pass over memory, and a fresh multi-MB
temporary costs several passes more in page faults (a 16 MB fresh output: ~12 passes on the 2-core EPYC of
``docs/BENCHMARKS_HISTORY.md`` §3.1), so the elementwise encoders spent 20–35 passes. Here a partition is processed in
blocks of about :data:`CHUNK` elements through buffers a :class:`Workspace` keeps across calls: the input is read
from memory once per sweep, the intermediates stay in cache, and nothing large is allocated per call.

Why these operations (each measured against its alternatives on CPU):

* comparisons write float outputs (``torch.ge(x, 0, out=f32)`` is vectorized, its bool form is not: 5× slower);
* float64 accumulation copies a block into a float64 buffer and sums it (``sum(dtype=float64)`` converts 5×
  slower);
* codes narrower than a byte are packed by one matrix-vector product per half-word (:func:`pack_float_codes`);
* decoding gathers whole groups of decoded values at once (:class:`TableDecoder`), or, for QSGD's per-block
  scale, unpacks and scales in place (:class:`AffineDecoder`); both reproduce the elementwise decode bit for bit;
* stochastic rounding draws with :func:`uniform_` (the generator's own stream at 60% of ``torch.rand``'s cost) or,
  for QSGD, :func:`dither_` (15-bit draws, a quarter of its cost).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, Iterator, Optional, Sequence

import torch

from . import bitpack

Tensor = torch.Tensor
CHUNK = 1 << 18            # elements per block: 1 MiB of fp32, a few such buffers stay in the 1 MiB L2 and L3
MASK24 = 0x00FFFFFF00FFFFFF
MASK15 = 0x7FFF7FFF7FFF7FFF
DecodeMode = str           # "set": out = v; "zero": out = 0 + v (what zero_() then += gives); "add": out += v


class Workspace:
    """Reusable per-call scratch, one buffer per (name, dtype, device), grown on demand and never shrunk.

    Contents never outlive a call, so a copy of the owner (the cost model deep-copies compressors) starts empty.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype, torch.device], Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = (name, dtype, torch.device(device))
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._bufs[key] = torch.empty(max(numel, 1), dtype=dtype, device=device)
        return buf[:numel]

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs.values())

    def __deepcopy__(self, memo: dict) -> "Workspace":
        return Workspace()


def chunk_size(align: int = 1) -> int:
    """Elements per block: a multiple of ``lcm(align, 16)`` (whole half-words of codes of any width, whole
    quantization blocks) close to :data:`CHUNK`."""
    unit = math.lcm(int(align), 16)
    return unit * max(1, CHUNK // unit)


def spans(n: int, step: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


# ---- reductions ------------------------------------------------------------------------------------------
def sum64(v: Tensor, ws: Workspace) -> Tensor:
    """``Σ v`` in float64 as a 0-d tensor (a copy into a float64 buffer, then a native float64 sum)."""
    if v.dtype == torch.float64:
        return v.sum()
    d = ws.get("sum64", v.numel(), torch.float64, v.device)
    d.copy_(v)
    return d.sum()


def std64(x: Tensor, ws: Workspace) -> Tensor:
    """Population standard deviation of ``x`` in float64 (two sweeps: the mean, then the squared deviations),
    as a 0-d float64 tensor; squares of fp32 values cannot overflow in float64."""
    step = chunk_size()
    n = x.numel()
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for lo, hi in spans(n, step):
        total.add_(sum64(x[lo:hi], ws))
    mean = total / n
    total.zero_()
    for lo, hi in spans(n, step):
        d = ws.get("std64", hi - lo, torch.float64, x.device)
        d.copy_(x[lo:hi]).sub_(mean)
        total.add_(torch.dot(d, d))
    return (total / n).sqrt_()


# ---- randomness ------------------------------------------------------------------------------------------
def uniform_(gen: torch.Generator, out: Tensor, ws: Workspace) -> Tensor:
    """Fill the fp32 ``out`` with ``U[0, 1)`` draws from ``gen`` (24-bit grid), continuing its stream.

    On CPU these are exactly the values ``torch.rand(out.numel(), generator=gen)`` draws, with each pair of
    neighbours swapped, and the generator ends in the same state: torch maps a 32-bit draw ``r`` to
    ``(r mod 2^24)·2^-24``, and an int64 ``random_`` packs two draws ``r1·2^32 + r2`` at half the per-element
    cost (1.7 against 2.8 ns per value here); reading the int64 as two int32 gives ``r2, r1``. Elsewhere it is
    ``torch.rand`` itself."""
    m = out.numel()
    if out.device.type != "cpu" or m < 2:
        return torch.rand(m, generator=gen, out=out)
    h = m // 2
    w = ws.get("rng64", h, torch.int64, out.device)
    w.random_(generator=gen).bitwise_and_(MASK24)
    out[:2 * h].copy_(w.view(torch.int32)).mul_(2.0 ** -24)
    if m > 2 * h:
        torch.rand(1, generator=gen, out=out[2 * h:])
    return out


def dither_(gen: torch.Generator, out: Tensor, offset: float, ws: Workspace) -> Tensor:
    """Fill the fp32 ``out`` with ``offset + (k + ½)·2^-15``, ``k`` uniform on ``[0, 2^15)`` from ``gen``: the
    dither of stochastic rounding, ``floor(v + u)``, on a 2^-15 grid (bias at most 2^-16 of a level — below
    what an fp32 sum ``v + u`` keeps of ``u`` once ``|v| ≥ 128``), with ``offset`` folded in for free.

    One int64 ``random_`` yields four 15-bit draws (each 16-bit lane masked to 15 bits: the generator's int64
    never sets the top bit, so a whole-lane draw would not be uniform), a quarter of ``torch.rand``'s cost per
    value on CPU. Elsewhere it is ``torch.rand`` itself, shifted by ``offset``."""
    m = out.numel()
    if out.device.type != "cpu":
        return torch.rand(m, generator=gen, out=out).add_(offset)
    w = ws.get("rng15", -(-m // 4), torch.int64, out.device)
    w.random_(generator=gen).bitwise_and_(MASK15)
    base = ws.get("rng15_base", 1, torch.float32, out.device).fill_(offset + 2.0 ** -16)
    return torch.add(base, w.view(torch.int16)[:m], alpha=2.0 ** -15, out=out)


# ---- packing ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _place_values(bits: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``2^(bits·j)`` for the ``16/bits`` codes of a half-word: their dot product with the codes is the half-word
    (exact in fp32: below 2^16)."""
    return (2.0 ** (bits * torch.arange(16 // bits, dtype=torch.float64))).to(dtype=dtype, device=device)


def pack_float_codes(v: Tensor, bits: int, words: Tensor, lo: int, ws: Workspace) -> None:
    """Pack the float codes ``v`` (exact integers in ``[0, 2^bits)``) of elements ``lo …`` (``lo`` a multiple of
    16) into the int32 view ``words``; a partial last half-word is padded with zero codes. Codes narrower than a
    byte are combined by one matrix-vector product per 16/bits codes (``[m/k, k] @ 2^(bits·j)``), about a third
    of what shifting and OR-ing bytes costs on CPU."""
    m = v.numel()
    if bits == 8:
        i32 = ws.get("pk_i32", m, torch.int32, v.device)
        words.view(torch.uint8)[lo:lo + m].copy_(i32.copy_(v))
        return
    k = 16 // bits
    h = -(-m // k)
    if h * k != m:
        pad = ws.get("pk_pad", h * k, v.dtype, v.device)
        pad[:m].copy_(v)
        pad[m:].zero_()
        v = pad
    halves = ws.get("pk_mv", h, v.dtype, v.device)
    torch.mv(v.view(h, k), _place_values(bits, v.dtype, v.device), out=halves)
    i32 = ws.get("pk_i32", h, torch.int32, v.device)
    h0 = lo * bits // 16
    words.view(torch.int16)[h0:h0 + h].copy_(i32.copy_(halves))    # int32 → int16 keeps the low 16 bits


def encode_blocks(n: int, bits: int, words: Tensor, step: int, codes_of: Callable[[int, int], Tensor],
                  ws: Workspace) -> None:
    """Drive one encode: ``codes_of(lo, hi)`` returns the float codes of elements ``[lo, hi)`` (a block of at most
    ``step`` elements, ``step`` from :func:`chunk_size`); they are packed into the int32 view ``words`` block by
    block and the unused tail of the last word is zeroed (a payload is a pure function of its codes)."""
    for lo, hi in spans(n, step):
        pack_float_codes(codes_of(lo, hi), bits, words, lo, ws)
    words.view(torch.uint8)[-(-n * bits // 8):].zero_()


# ---- decoding ------------------------------------------------------------------------------------------
def unpack_block(src: Tensor, bits: int, lo: int, m: int, ws: Workspace) -> Tensor:
    """The one-byte codes of elements ``[lo, lo + m)`` of the packed bytes ``src`` (``lo`` on a byte boundary),
    as a uint8 view into scratch."""
    per = 8 // bits
    nb = -(-m // per)
    if per == 1:
        return src[lo:lo + m]
    codes = ws.get("sp_codes", nb * per, torch.uint8, src.device)
    bitpack.unpack_bytes(src[lo // per:lo // per + nb], bits, codes, ws.get("sp_work", nb * per, torch.uint8,
                                                                           src.device))
    return codes[:m]


class Decoder:
    """How one payload's packed codes become values: :meth:`write` fills ``dst`` (contiguous, ``m`` elements of
    the output dtype) with the values of elements ``[lo, lo + m)``; with ``zero`` as ``0 + value`` (what a
    zeroed output accumulating it holds: ``−0.0`` becomes ``+0.0``). ``block``: blocks must not be split."""

    block = 0

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def write(self, src: Tensor, lo: int, m: int, dst: Tensor, zero: bool, ws: Workspace) -> None:
        raise NotImplementedError


class TableDecoder(Decoder):
    """Arbitrary levels (``levels[c]``: ``2^bits`` values in the output dtype, e.g. TernGrad's pinned maximum).

    Decoding is a 1-D gather of whole *entries*: the values of ``g`` consecutive codes (an index of ``g·bits ≤ 8``
    bits) copied as one 4-, 8- or 16-byte element (int32, int64 or complex128: a bit-exact move, no arithmetic),
    so one gathered element carries up to four values. Per value that is 2–4× cheaper than gathering rows of a
    2-D table or single values (the cost is per gathered element; 16-bit indexes over a 65536-entry table were
    slower still for 8-bit codes, the table costing more to build than the gathers saved)."""

    def __init__(self, levels: Tensor, bits: int) -> None:
        super().__init__(bits)
        item = levels.element_size()
        g = min(16 // item, 8 // bits)
        while g * item not in _ENTRY:
            g //= 2
        self.g, self.width, self.dtype = g, g * bits, _ENTRY[g * item]
        self.values = levels[bitpack.group_codes(bits, g, levels.device)]      # [2^(g·bits), g]
        self._entries: dict[bool, Tensor] = {}

    def entries(self, zero: bool) -> Tensor:
        e = self._entries.get(zero)
        if e is None:
            e = self._entries[zero] = (self.values + 0.0 if zero else self.values).contiguous().view(self.dtype)[:, 0]
        return e

    def write(self, src: Tensor, lo: int, m: int, dst: Tensor, zero: bool, ws: Workspace) -> None:
        g = self.g
        ne = -(-m // g)
        idx = ws.get("dec_idx", ne, torch.int32, src.device)
        idx.copy_(unpack_block(src, self.width, lo // g, ne, ws))
        if ne * g == m and dst.storage_offset() % g == 0:
            torch.index_select(self.entries(zero), 0, idx, out=dst.view(self.dtype))
        else:                                              # a partial last entry, or dst not aligned to entries
            tmp = ws.get("dec_tail", ne * g, dst.dtype, dst.device)
            torch.index_select(self.entries(zero), 0, idx, out=tmp.view(self.dtype))
            dst.copy_(tmp[:m])


_ENTRY = {4: torch.int32, 8: torch.int64, 16: torch.complex128}


class AffineDecoder(Decoder):
    """``(c + offset)·factor`` with one factor per block of ``block`` elements (QSGD's ``ν·scale/s``): the
    codes are unpacked to floats and scaled in place, the elementwise decode's arithmetic bit for bit
    (``c + offset`` is an exact small integer)."""

    def __init__(self, bits: int, offset: float, factor: Tensor, block: int) -> None:
        super().__init__(bits)
        self.offset, self.factor, self.block = offset, factor, block

    def write(self, src: Tensor, lo: int, m: int, dst: Tensor, zero: bool, ws: Workspace) -> None:
        dst.copy_(unpack_block(src, self.bits, lo, m, ws))
        dst.add_(self.offset)
        b = self.block
        r0, full = lo // b, m // b
        if full:
            _scale(dst[:full * b].view(full, b), self.factor[r0:r0 + full, None], zero)
        if full * b < m:
            _scale(dst[full * b:], self.factor[r0 + full], zero)


def _scale(v: Tensor, factor: Tensor, zero: bool) -> None:
    """``v ← v·factor``, then ``+ 0.0`` with ``zero`` (the product is rounded once either way)."""
    v.mul_(factor)
    if zero:
        v.add_(0.0)


def decoded_sq_norm(decoder: Decoder, src: Tensor, count: int, ws: Workspace) -> Tensor:
    """``‖D(p)‖²`` of one payload as a 0-d float64 tensor, block by block: each block is decoded into scratch and
    its squares are summed in float64 (exact per term), so no decoded copy of the partition is ever formed."""
    total = torch.zeros((), dtype=torch.float64, device=src.device)
    for lo, hi in spans(count, chunk_size(decoder.block or 1)):
        vals = ws.get("sq_vals", hi - lo, torch.float32, src.device)
        decoder.write(src, lo, hi - lo, vals, False, ws)
        d = ws.get("sq_f64", hi - lo, torch.float64, src.device)
        d.copy_(vals)
        total.add_(torch.dot(d, d))
    return total


def decode_sum(decoders: Sequence[Decoder], rows: Sequence[Tensor], count: int, out: Tensor, mode: DecodeMode,
               ws: Workspace, residual: Optional[Tensor] = None) -> None:
    """``out (=|= 0 +|+=) Σ_w D_w (+ residual)`` over ``count`` elements, block by block, in row order:
    ``rows[w]`` are the packed code bytes (uint8) of payload ``w``, decoded by ``decoders[w]``. The first row is
    written straight into ``out`` unless it accumulates; every other one goes through a cached block."""
    if not out.is_contiguous():
        tmp = out.contiguous()
        decode_sum(decoders, rows, count, tmp, mode, ws, residual)
        out.copy_(tmp)
        return
    step = chunk_size(max(d.block for d in decoders) or 1)
    for lo, hi in spans(count, step):
        m = hi - lo
        oc = out[lo:hi]
        for w, (dec, src) in enumerate(zip(decoders, rows)):
            if w == 0 and mode != "add":
                dec.write(src, lo, m, oc, mode == "zero", ws)
                continue
            vals = ws.get("dec_vals", m, out.dtype, out.device)
            dec.write(src, lo, m, vals, False, ws)
            oc.add_(vals)
        if residual is not None:
            oc.add_(residual[lo:hi])


__all__ = ["CHUNK", "Workspace", "chunk_size", "spans", "sum64", "std64", "uniform_", "dither_", "pack_float_codes",
           "encode_blocks", "unpack_block", "Decoder", "TableDecoder", "AffineDecoder", "decoded_sq_norm", "decode_sum"]
