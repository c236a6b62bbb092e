"""Counter-based random numbers for the device path: draw ``i`` of a stream is a pure function of its seed and
``i`` (the SplitMix64 sequence: ``splitmix64(seed + i·φ)``), computed with a handful of int64 tensor operations.

Why. A GPU draws from a ``torch.Generator`` well, but the CPU path's tricks (``qkernels.uniform_``/``dither_``
read the CPU generator's packed int64 draws) do not exist there, and a generator re-seeded per call on the
device is host work per call. A counter-based stream needs no generator object, never synchronizes, and gives
the same bits on every device and rank (integer arithmetic wraps identically on CPU and GPU), so the device
path's codes can be checked on CPU bit for bit. The CPU path keeps its generator streams (its outputs, tests and
benchmark figures depend on them); only the device path (``device_path.host_kernels`` false) draws here.
"""
from __future__ import annotations

import torch

from .base import MASK64

Tensor = torch.Tensor
GOLDEN = 0x9E3779B97F4A7C15
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _s64(c: int) -> int:
    """The int64 with the bit pattern of the unsigned 64-bit ``c``."""
    c &= MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` is arithmetic)."""
    return torch.bitwise_right_shift(z, s).bitwise_and_((1 << (64 - s)) - 1)


def splitmix_block(seed: int, start: int, count: int, device: torch.device) -> Tensor:
    """Draws ``start … start+count−1`` of the stream ``seed`` as int64 bit patterns of the 64-bit outputs."""
    z = torch.arange(start, start + count, dtype=torch.int64, device=device)
    z.mul_(_s64(GOLDEN)).add_(_s64(seed + GOLDEN))
    z = z.bitwise_xor_(_shr(z, 30)).mul_(_s64(MIX1))
    z = z.bitwise_xor_(_shr(z, 27)).mul_(_s64(MIX2))
    return z.bitwise_xor_(_shr(z, 31))


class CounterStream:
    """One rank-local or shared stream: a seed and the position of its next draw (host integers only)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.pos = int(seed) & MASK64, 0

    def _next(self, count: int, device: torch.device) -> Tensor:
        z = splitmix_block(self.seed, self.pos, count, device)
        self.pos += count
        return z

    def uniform_(self, out: Tensor) -> Tensor:
        """Fill the fp32 ``out`` with ``U[0, 1)`` on the 24-bit grid (the top 24 bits of each draw)."""
        z = self._next(out.numel(), out.device)
        return out.copy_(_shr(z, 40).view_as(out)).mul_(2.0 ** -24)

    def dither_(self, out: Tensor, offset: float) -> Tensor:
        """Fill the fp32 ``out`` with ``offset + (k + ½)·2^-15``, ``k`` the top 15 bits of each draw (the grid of
        ``qkernels.dither_``)."""
        z = self._next(out.numel(), out.device)
        return out.copy_(_shr(z, 49).view_as(out)).mul_(2.0 ** -15).add_(offset + 2.0 ** -16)


__all__ = ["CounterStream", "splitmix_block"]
