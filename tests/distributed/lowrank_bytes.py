"""Bytes of one low-rank step, from the methods' wire formulas (importable by the tests and spawned ranks).

Per matrix ``n × m`` at rank r (PyTorch's rule with rate 2: factors only if ``(n + m)·r·2 < n·m``): PowerSGD sends
``n·r`` then ``m·r`` fp32 values, ACP-SGD ``n·r`` on P-steps and ``m·r`` on Q-steps; a matrix that does not pay at
r is sent plain (``n·m`` fp32); 1-D tensors and matrices that never pay travel on the dense path in the
communication dtype. Every all-reduce is a ring: ``2(N−1)/N`` of its payload per rank."""
from __future__ import annotations

from typing import Callable

from torch import nn

from ds_gravac.compress.lowrank import matrix_shape

RATE = 2.0


def step_bytes(model: nn.Module, comp: str, rank_of: Callable[[str, int, int], int], p_step: bool,
               world: int = 2, comm_bytes: int = 4) -> float:
    factors = dense = 0
    for name, p in model.named_parameters():
        n, m = matrix_shape(p.shape)
        if p.dim() < 2 or (n + m) * RATE >= n * m:
            dense += p.numel()
            continue
        r = min(rank_of(name, n, m), n, m)
        if (n + m) * r * RATE >= n * m:
            factors += n * m
        elif comp == "powersgd":
            factors += (n + m) * r
        else:
            factors += n * r if p_step else m * r
    return 2.0 * (world - 1) / world * (4 * factors + comm_bytes * dense)


def rank_for_cf(n: int, m: int, theta: float, pair: float) -> int:
    """The largest rank whose CF ``pair·n·m/((n+m)·r)`` is still >= θ, at least 1 (GraVAC over ranks)."""
    return max([1] + [k for k in range(1, min(n, m) + 1) if pair * n * m / ((n + m) * k) >= theta])
