"""How much error a plan may add: the summed budget ``β · error(reference)`` and the per-group caps.

The reference is the family's validated level on every group (rank 16, 8 bits, CF 30) — over low rank, a group
that some rank of its ladder sends exactly takes the smallest such rank instead (:func:`exact_reference`); β is
``budget_tight`` at the start, after a learning-rate drop and when the norm-change rule fired, ``budget_quiet``
otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...config import AutoConfig
from .ladder import LOWRANK, QSGD, Group
from .solver import totals


@dataclass(frozen=True)
class Budget:
    """The reference's predicted seconds and error, the summed error budget, and the per-group caps (None:
    uncapped)."""

    ref_time: float
    ref_error: float
    total: float
    caps: Optional[tuple[float, ...]]
    reference: tuple[int, ...] = ()


def exact_reference(groups: Sequence[Group], errors: Sequence[Sequence[float]], reference: Sequence[int]
                    ) -> list[int]:
    """The reference codes, except that a group whose reference rung leaves error while a low-rank rung of its
    ladder was measured exact (error 0: ``auto.exact_fraction``) takes the smallest exact rank.

    Why: the unsent energy undercounts what a fully connected layer loses. VGG16-bn's 4096 × 25088 and
    4096 × 4096 matrices (batch 64: their gradients have rank ≤ 64) leave only 15–25% unsent at rank 16, yet rank
    16 on those two alone ended +14.4% from dense (one seed) where rank 64, exact, ended +1.1% — at a 28th of
    dense's bf16 bytes. As the reference, the exact rank's zero error also caps the group at zero error
    (``group_cap · β · 0``): it goes exact or dense, and the other groups keep their share of the budget."""
    out = list(reference)
    for g, (group, row) in enumerate(zip(groups, errors)):
        exact = [i for i, level in enumerate(group.ladder) if level.family == LOWRANK and row[i] == 0.0]
        if exact and row[reference[g]] > 0.0:
            out[g] = max(exact)              # ladders run from rank 64 down: the last exact rung is the smallest
    return out


def error_budget(auto: AutoConfig, family: str, times: Sequence[Sequence[float]],
                 errors: Sequence[Sequence[float]], reference: Sequence[int], tight: bool,
                 signal: Optional[float] = None, groups: Optional[Sequence[Group]] = None) -> Budget:
    """β times the reference's error; over a quantizer, while quiet, at least the variance that keeps
    ``S/(S + V)`` at ``efficiency_floor`` (``signal``: ``S``; 8 bits everywhere adds far less than a step's signal
    energy).

    Caps: per group ``group_cap · β · error(reference)`` under an error-feedback family (low rank, Top-k). The
    summed unsent energy is only a proxy, and without a cap one group (an embedding, say) can take the whole
    model's budget at rank 2 while the rest goes dense — that group then learns from a rank-2 gradient. Over a
    quantizer the added variances sum exactly in ``S/(S + ΣV)``, so the sum alone is the model: no caps.

    ``groups`` (over low rank): the reference becomes :func:`exact_reference`'s; ``Budget.reference`` is the one
    used."""
    if groups is not None and family == LOWRANK:
        reference = exact_reference(groups, errors, reference)
    ref_t, ref_e = totals(times, errors, reference)
    beta = float(auto.budget_tight if tight else auto.budget_quiet)
    total = beta * ref_e
    if not tight and family == QSGD and signal is not None:
        total = max(total, signal * (1.0 / float(auto.efficiency_floor) - 1.0))
    caps = None
    if auto.group_cap is not None and family != QSGD:
        caps = tuple(float(auto.group_cap) * beta * errors[g][c] for g, c in enumerate(reference))
    return Budget(ref_t, ref_e, total, caps, tuple(reference))


__all__ = ["Budget", "exact_reference", "error_budget"]
