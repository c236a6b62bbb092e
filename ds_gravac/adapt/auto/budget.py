"""How much error a plan may add: the summed budget ``β · error(reference)`` and the per-group caps.

The reference is the family's validated level on every group (rank 16, 8 bits, CF 30) — over low rank, a group
that some rank of its ladder sends exactly takes the smallest such rank instead (:func:`exact_reference`); β is
``budget_tight`` at the start, after a learning-rate drop and when the norm-change rule fired, ``budget_quiet``
otherwise. With ``tight_time_slack`` a tight phase lowers β only as far as time allows (:func:`time_bounded_total`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ...config import AutoConfig
from .ladder import LOWRANK, QSGD, Group
from .solver import solve, totals


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


def time_bounded_total(times: Sequence[Sequence[float]], errors: Sequence[Sequence[float]], quiet: Budget,
                       tight_total: float, slack: float, compute_s: float) -> float:
    """A tight phase's error budget bounded by time: the least summed error of any plan (within the quiet caps)
    whose predicted exchange stays within ``slack`` of a step of the quiet plan's, and never less than
    ``tight_total``.

    Why: "dense where cheap" read literally. On ``lstm_long`` at 100 Mbit/s the fixed tight β made 200–350 of each
    run's steps 2.5–3× slower (0.70–0.86 s against 0.26–0.28 s) and bought no step to target (docs/algorithms.md
    §8); bounded by time, a tight phase spends what a slow link leaves over and a fast one sends dense. Computed as
    the same knapsack with the roles swapped (least error under a time budget); ``compute_s`` is the last
    measured compute (0 before one: the bound is then on the exchange alone)."""
    fast = solve(times, errors, quiet.total, reference=quiet.reference or None, caps=quiet.caps)
    bound = fast.time + slack * (max(0.0, compute_s) + fast.time)
    over_cap = sum(max(row) for row in times) + bound + 1.0      # a level above its quiet cap never fits the bound
    priced = [[t if quiet.caps is None or e <= quiet.caps[g] else over_cap for t, e in zip(trow, erow)]
              for g, (trow, erow) in enumerate(zip(times, errors))]
    least = solve(errors, priced, bound)            # roles swapped: the least Σ e subject to Σ t ≤ bound
    found = least.time if least.feasible else fast.error     # the quiet plan fits the bound by construction
    return max(float(tight_total), min(found, fast.error))


def error_budget(auto: AutoConfig, family: str, times: Sequence[Sequence[float]],
                 errors: Sequence[Sequence[float]], reference: Sequence[int], tight: bool,
                 signal: Optional[float] = None, groups: Optional[Sequence[Group]] = None,
                 compute_s: float = 0.0) -> Budget:
    """β times the reference's error; over a quantizer, while quiet, at least the variance that keeps
    ``S/(S + V)`` at ``efficiency_floor`` (``signal``: ``S``; 8 bits everywhere adds far less than a step's signal
    energy).

    Caps: per group ``group_cap · β · error(reference)`` under an error-feedback family (low rank, Top-k). The
    summed unsent energy is only a proxy, and without a cap one group (an embedding, say) can take the whole
    model's budget at rank 2 while the rest goes dense — that group then learns from a rank-2 gradient. Over a
    quantizer the added variances sum exactly in ``S/(S + ΣV)``, so the sum alone is the model: no caps.

    ``groups`` (over low rank): the reference becomes :func:`exact_reference`'s; ``Budget.reference`` is the one
    used. Tight with ``auto.tight_time_slack``: :func:`time_bounded_total`, under the quiet caps."""
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
    if tight and auto.tight_time_slack is not None:
        quiet = error_budget(auto, family, times, errors, reference, False, signal)
        total = time_bounded_total(times, errors, quiet, total, float(auto.tight_time_slack), compute_s)
        caps = quiet.caps
    return Budget(ref_t, ref_e, total, caps, tuple(reference))


__all__ = ["Budget", "exact_reference", "error_budget"]
