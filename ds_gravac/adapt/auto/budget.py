"""How much error a plan may add: the summed budget ``β · error(reference)`` and the per-group caps.

The reference is the family's validated level on every group (rank 16, 8 bits, CF 30); β is ``budget_tight`` at
the start, after a learning-rate drop and when the norm-change rule fired, ``budget_quiet`` otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...config import AutoConfig
from .ladder import QSGD
from .solver import totals


@dataclass(frozen=True)
class Budget:
    """The reference's predicted seconds and error, the summed error budget, and the per-group caps (None:
    uncapped)."""

    ref_time: float
    ref_error: float
    total: float
    caps: Optional[tuple[float, ...]]


def error_budget(auto: AutoConfig, family: str, times: Sequence[Sequence[float]],
                 errors: Sequence[Sequence[float]], reference: Sequence[int], tight: bool,
                 signal: Optional[float] = None) -> Budget:
    """β times the reference's error; over a quantizer, while quiet, at least the variance that keeps
    ``S/(S + V)`` at ``efficiency_floor`` (``signal``: ``S``; 8 bits everywhere adds far less than a step's signal
    energy).

    Caps: per group ``group_cap · β · error(reference)`` under an error-feedback family (low rank, Top-k). The
    summed unsent energy is only a proxy, and without a cap one group (an embedding, say) can take the whole
    model's budget at rank 2 while the rest goes dense — that group then learns from a rank-2 gradient. Over a
    quantizer the added variances sum exactly in ``S/(S + ΣV)``, so the sum alone is the model: no caps."""
    ref_t, ref_e = totals(times, errors, reference)
    beta = float(auto.budget_tight if tight else auto.budget_quiet)
    total = beta * ref_e
    if not tight and family == QSGD and signal is not None:
        total = max(total, signal * (1.0 / float(auto.efficiency_floor) - 1.0))
    caps = None
    if auto.group_cap is not None and family != QSGD:
        caps = tuple(float(auto.group_cap) * beta * errors[g][c] for g, c in enumerate(reference))
    return Budget(ref_t, ref_e, total, caps)


__all__ = ["Budget", "error_budget"]
