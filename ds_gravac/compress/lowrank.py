"""Rules shared by the low-rank compressors (PowerSGD, ACP-SGD): the matrix view of a tensor, which tensors are
worth compressing at a rank, shared seeded factors, and orthogonalization.

Kept free of communication and of any per-step state, so both compressors and their float64 tests use the very
same arithmetic. All factor math is fp32 (or the caller's float64 in tests), whatever the gradient dtype.
"""
from __future__ import annotations

import math
from typing import Literal, Sequence

import torch

from .base import stable_hash

Tensor = torch.Tensor
Orthogonalization = Literal["qr", "gram_schmidt"]


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """A tensor of shape ``(s0, s1, ...)`` viewed as ``s0 × (s1·s2·…)``; 1-D tensors are ``s0 × 1``."""
    n = int(shape[0]) if len(shape) else 1
    m = 1
    for s in shape[1:]:
        m *= int(s)
    return n, m


def matrix_rank(n: int, m: int, rank: int) -> int:
    """The rank a matrix actually gets: never above either side."""
    return max(0, min(int(rank), n, m))


def worth_compressing(shape: Sequence[int], rank: int, min_compression_rate: float) -> bool:
    """PyTorch's rule: compress an ``n × m`` matrix at rank r iff ``(n + m)·r·rate < n·m``; 1-D tensors never."""
    if len(shape) < 2:
        return False
    n, m = matrix_shape(shape)
    r = matrix_rank(n, m, rank)
    return r > 0 and (n + m) * r * float(min_compression_rate) < n * m


def compression_factor(n: int, m: int, rank: int) -> float:
    """Values of the matrix per value sent for one full P/Q exchange: ``n·m / ((n + m)·r)``."""
    r = matrix_rank(n, m, rank)
    return n * m / ((n + m) * r) if r > 0 else 1.0


# GraVAC's uniform rank ladder (``"rank_ladder": "uniform"``): every matrix at one rank per level. Level θ of rung r
# is UNIFORM_TOP / r (2 at rank 64 … 128 at rank 1): a level index that grows with compression as the controller
# needs, not a measured CF.
UNIFORM_RANKS = (64, 32, 16, 8, 4, 2, 1)
UNIFORM_TOP = 2 * UNIFORM_RANKS[0]


def uniform_levels() -> list[float]:
    """The ladder's levels, sorted (the compressor's CF grid under ``rank_ladder: "uniform"``)."""
    return sorted(UNIFORM_TOP / r for r in UNIFORM_RANKS)


def uniform_rank(level: float) -> int:
    """The ladder rank of a level (levels between rungs round to the lower rank)."""
    return max(1, int(math.floor(UNIFORM_TOP / float(level) + 1e-9)))


def seeded_factor(seed: int, key: str, rows: int, rank: int, change: int = 0,
                  dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> Tensor:
    """An ``N(0, 1)`` ``rows × rank`` factor drawn from a CPU generator seeded by ``(seed, key, change)``.

    Identical on every rank and independent of the global RNG and of the device (drawn on the CPU, then moved):
    ranks that started from different factors would average unrelated subspaces (ACP-SGD's first aggregate is
    then wrong by ~87% at 2 ranks). ``change`` counts rank changes of the tensor, so a re-drawn factor differs."""
    gen = torch.Generator().manual_seed(stable_hash(f"lowrank:{int(seed)}:{key}:{int(change)}") % (2**63 - 1))
    return torch.randn(rows, rank, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)


def orthogonalize(a: Tensor, method: Orthogonalization = "qr", eps: float = 1e-8) -> Tensor:
    """Orthonormal columns spanning ``a`` (``rows × r`` or a batch ``b × rows × r``), as a new tensor.

    ``qr``: reduced QR (finite orthonormal columns even for zero or rank-deficient input). ``gram_schmidt``: column
    by column, dividing by ``norm + eps`` — with ``eps = 0`` a zero column would become NaN (PyTorch's default), so
    ``eps`` must be > 0; a zero column then stays zero."""
    if method == "qr":
        return torch.linalg.qr(a, mode="reduced")[0]
    if eps <= 0:
        raise ValueError("ds_gravac: gram_schmidt orthogonalization needs orth_eps > 0 (a zero column gives NaN)")
    q = a.clone()
    for i in range(q.shape[-1]):
        col = q[..., i:i + 1]
        col /= torch.linalg.vector_norm(col, dim=-2, keepdim=True) + eps
        if i + 1 < q.shape[-1]:
            rest = q[..., i + 1:]
            rest -= col * (col.transpose(-1, -2) @ rest)
    return q
