"""The plan: one level per group with the least predicted step time whose summed error stays within a budget.

A multiple-choice knapsack: group g at level j costs ``t[g][j]`` seconds and adds ``e[g][j]`` error; minimize
``Σ t`` subject to ``Σ e ≤ B`` and, optionally, ``e[g][j] ≤ cap[g]`` per group (levels above a group's cap are
simply not offered, so one group cannot spend the whole model's budget). Everything is float64 and summed in group order, and ties are broken by the
smaller error, then by the code vector compared group by group (the lower level index first), so the same input
gives the same plan on every rank and in every run.

1. **Lagrangian bisection.** For a multiplier λ every group independently takes ``argmin t + λ·e``; the error of
   that choice falls as λ grows and changes only at finitely many breakpoints (the slopes between a group's
   levels). λ is bisected over the points between consecutive breakpoints (where no rounding can split a tie),
   which ends exactly at the first interval whose choice fits the budget.
2. **Repair.** The slack that choice leaves is spent greedily: the move (group, level) that saves the most time
   and still fits, until none does. The result, or the reference setting if that is faster, is the incumbent.
3. **Exact search.** A dynamic program over groups keeps the Pareto frontier of partial plans (time, error),
   dropping partial plans that cannot fit the budget or cannot beat the incumbent. It is exact; if the frontier
   outgrows ``frontier_cap``, the incumbent is returned and the plan says ``exact=False``.

The reference (the family's validated level on every group) is always a candidate, so whenever it fits the
budget the plan is never predicted slower than it, and never above the budget.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np

FRONTIER_CAP = 4096


@dataclass(frozen=True)
class Plan:
    """One level code per group, with its predicted seconds and error (sums in group order)."""

    codes: tuple[int, ...]
    time: float
    error: float
    feasible: bool
    exact: bool

    def key(self) -> tuple:
        return (self.time, self.error, self.codes)


def totals(times: Sequence[Sequence[float]], errors: Sequence[Sequence[float]], codes: Sequence[int]
           ) -> tuple[float, float]:
    """``(Σ t, Σ e)`` of a code vector, summed in group order (the one order every function here uses)."""
    t = e = 0.0
    for g, c in enumerate(codes):
        t += times[g][c]
        e += errors[g][c]
    return t, e


def within_caps(errors: Sequence[Sequence[float]], codes: Sequence[int], caps: Optional[Sequence[float]]) -> bool:
    """Every group's error at its code is at most its cap (no caps: always)."""
    return caps is None or all(errors[g][c] <= caps[g] for g, c in enumerate(codes))


def _capped(es: list[np.ndarray], opts: list[np.ndarray], caps: Optional[Sequence[float]]) -> list[np.ndarray]:
    """Each group's levels within its cap; a group with none keeps its least-error levels (the plan is then
    infeasible, and least-error is the fallback anyway)."""
    if caps is None:
        return opts
    out = []
    for e, o, cap in zip(es, opts, caps):
        kept = o[e[o] <= cap]
        out.append(kept if kept.size else o[e[o] == e[o].min()])
    return out


def _check(times: Sequence[Sequence[float]], errors: Sequence[Sequence[float]], budget: float,
           caps: Optional[Sequence[float]] = None) -> None:
    if caps is not None and (len(caps) != len(times) or any(math.isnan(c) or c < 0 for c in caps)):
        raise ValueError(f"ds_gravac: {len(times)} groups need as many caps >= 0 (got {list(caps)})")
    if len(times) != len(errors):
        raise ValueError(f"ds_gravac: {len(times)} time rows but {len(errors)} error rows")
    for g, (tr, er) in enumerate(zip(times, errors)):
        if not tr or len(tr) != len(er):
            raise ValueError(f"ds_gravac: group {g} has {len(tr)} times and {len(er)} errors (>= 1, equal)")
        if not all(math.isfinite(v) for v in tr) or not all(math.isfinite(v) and v >= 0 for v in er):
            raise ValueError(f"ds_gravac: group {g} has a non-finite time or a negative/non-finite error")
    if not math.isfinite(budget):
        raise ValueError(f"ds_gravac: the error budget must be finite (got {budget})")


def undominated(ts: list[np.ndarray], es: list[np.ndarray]) -> list[np.ndarray]:
    """Per group, the levels no other level of the group beats: a level ``j`` goes when some ``i`` has
    ``t_i ≤ t_j`` and ``e_i ≤ e_j``, and either is strictly smaller or ``i < j`` (equal values: the lower index
    wins the tie)."""
    every = [np.arange(t.size) for t in ts]
    tp, ep = _padded(ts, every, np.inf), _padded(es, every, np.inf)
    ti, tj, ei, ej = tp[:, :, None], tp[:, None, :], ep[:, :, None], ep[:, None, :]     # [g, i, j]
    earlier = np.arange(tp.shape[1])[:, None] < np.arange(tp.shape[1])[None, :]
    beaten = ((ti <= tj) & (ei <= ej) & ((ti < tj) | (ei < ej) | earlier)).any(axis=1)
    return [np.flatnonzero(~beaten[g, :t.size]) for g, t in enumerate(ts)]


def _padded(rows: list[np.ndarray], opts: list[np.ndarray], fill: float) -> np.ndarray:
    """Groups × levels, levels outside ``opts`` (and padding) set to ``fill``."""
    out = np.full((len(rows), max(r.size for r in rows)), fill)
    for g, (r, o) in enumerate(zip(rows, opts)):
        out[g, o] = r[o]
    return out


def _choose(tp: np.ndarray, ep: np.ndarray, lam: float) -> np.ndarray:
    """Per group ``argmin t + λ·e``, ties to the smaller error, then the lower index (λ = ∞: the least error,
    ties to the least time). ``tp``/``ep``: padded with +∞ where a level is not allowed."""
    if math.isfinite(lam):
        valid = np.isfinite(tp)
        first, second = np.where(valid, tp + lam * np.where(valid, ep, 0.0), np.inf), ep
    else:
        first, second = ep, tp
    tied = first == first.min(axis=1, keepdims=True)
    second = np.where(tied, second, np.inf)
    return np.argmax(second == second.min(axis=1, keepdims=True), axis=1)


def lagrangian(ts: list[np.ndarray], es: list[np.ndarray], opts: list[np.ndarray], budget: float
               ) -> Optional[tuple[list[int], float]]:
    """The choice just above the smallest breakpoint λ that fits the budget, and that λ (None if not even the
    least error of every group fits)."""
    tp, ep = _padded(ts, opts, np.inf), _padded(es, opts, np.inf)
    rows = np.arange(len(ts))

    def err(codes: np.ndarray) -> float:
        total = 0.0
        for v in ep[rows, codes].tolist():
            total += v
        return total

    with np.errstate(invalid="ignore", divide="ignore"):
        dt = tp[:, None, :] - tp[:, :, None]            # [g, i, j] = t_j − t_i
        de = ep[:, :, None] - ep[:, None, :]            # [g, i, j] = e_i − e_j
        ok = (dt > 0) & (de > 0) & np.isfinite(dt) & np.isfinite(de)
        breaks = np.unique(np.concatenate([[0.0], dt[ok] / de[ok]]))
    # between breakpoints the choice is constant and free of ties that rounding could split
    grid = np.concatenate([[0.0], (breaks[:-1] + breaks[1:]) / 2, [2.0 * breaks[-1] + 1.0]])
    if err(_choose(tp, ep, float(grid[0]))) <= budget:
        return _choose(tp, ep, float(grid[0])).tolist(), float(grid[0])
    if err(_choose(tp, ep, float(grid[-1]))) > budget:     # above every breakpoint: every least error
        return None
    lo, hi = 0, grid.size - 1                    # err(lo) > budget >= err(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if err(_choose(tp, ep, float(grid[mid]))) <= budget:
            hi = mid
        else:
            lo = mid
    return _choose(tp, ep, float(grid[hi])).tolist(), float(grid[hi])


def repair(ts: list[np.ndarray], es: list[np.ndarray], opts: list[np.ndarray], codes: list[int], budget: float
           ) -> list[int]:
    """Spend the budget's slack: apply the fitting move that saves the most time (ties: group, then level)."""
    tp, ep = _padded(ts, opts, np.inf), _padded(es, opts, np.inf)
    rows = np.arange(len(ts))
    cur = np.asarray(codes, dtype=np.int64)
    for _ in range(tp.size):
        err = 0.0
        for v in ep[rows, cur].tolist():
            err += v
        with np.errstate(invalid="ignore"):
            gain = np.where(err - ep[rows, cur][:, None] + ep <= budget, tp[rows, cur][:, None] - tp, -np.inf)
        flat = int(np.argmax(gain))                   # first maximum in row-major order: lowest group, level
        if not gain.flat[flat] > 0:
            break
        cur[flat // tp.shape[1]] = flat % tp.shape[1]
    return cur.tolist()


def pareto_search(ts: list[np.ndarray], es: list[np.ndarray], opts: list[np.ndarray], budget: float,
                  incumbent_time: float, lam: float, cap: int) -> Optional[list[int]]:
    """The exact optimum by a dynamic program over Pareto frontiers (see the module docstring); None if the
    frontier outgrew ``cap`` or nothing fits. A partial plan (time T, error E) is dropped when even the least
    error of the remaining groups exceeds the budget, or when the Lagrangian bound of its completions,
    ``T + Σ_rest min(t + λ·e) − λ·(B − E)`` (valid for every λ ≥ 0; the largest over a few multiples of the
    budget's λ, since a partial plan's remaining budget differs from the whole one), exceeds the incumbent."""
    n = len(ts)
    lams = np.array([0.0, 0.25 * lam, 0.5 * lam, lam, 2.0 * lam, 4.0 * lam])
    suf_l, suf_e = np.zeros((n + 1, lams.size)), [0.0] * (n + 1)
    for g in range(n - 1, -1, -1):
        o = opts[g]
        suf_l[g] = suf_l[g + 1] + (ts[g][o][None, :] + lams[:, None] * es[g][o][None, :]).min(axis=1)
        suf_e[g] = suf_e[g + 1] + float(es[g][o].min())
    slack_e = 1e-9 * (abs(budget) + suf_e[0]) + 1e-300
    slack_t = 1e-9 * (abs(incumbent_time) + float(np.abs(suf_l[0]).max()) + lams[-1] * abs(budget)) + 1e-300
    T, E, lex = np.zeros(1), np.zeros(1), np.zeros(1, dtype=np.int64)
    parents: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    for g in range(n):
        o = opts[g]
        ct = (T[:, None] + ts[g][o][None, :]).ravel()
        ce = (E[:, None] + es[g][o][None, :]).ravel()
        cl = (lex[:, None] * o.size + np.arange(o.size)[None, :]).ravel()
        bound = ct + (suf_l[g + 1][None, :] - lams[None, :] * (budget - ce)[:, None]).max(axis=1)
        keep = (ce + suf_e[g + 1] <= budget + slack_e) & (bound <= incumbent_time + slack_t)
        idx = np.flatnonzero(keep)
        if idx.size == 0:
            return None
        order = idx[np.lexsort((cl[idx], ct[idx], ce[idx]))]
        tt = ct[order]
        running = np.minimum.accumulate(tt)
        front = np.ones(order.size, dtype=bool)
        front[1:] = tt[1:] < running[:-1]
        order = order[front]
        if order.size > cap:
            return None
        T, E = ct[order], ce[order]
        lex = np.empty(order.size, dtype=np.int64)
        lex[np.argsort(cl[order], kind="stable")] = np.arange(order.size)
        parents.append(order // o.size)
        levels.append(o[order % o.size])
    fits = np.flatnonzero(E <= budget)
    if fits.size == 0:
        return None
    best = fits[np.lexsort((lex[fits], E[fits], T[fits]))[0]]
    codes = [0] * n
    for g in range(n - 1, -1, -1):
        codes[g] = int(levels[g][best])
        best = parents[g][best]
    return codes


def solve(times: Sequence[Sequence[float]], errors: Sequence[Sequence[float]], budget: float,
          reference: Optional[Sequence[int]] = None, fixed: Optional[Mapping[int, int]] = None,
          frontier_cap: int = FRONTIER_CAP, caps: Optional[Sequence[float]] = None) -> Plan:
    """The plan of least ``Σ t`` with ``Σ e ≤ budget`` and every group within its cap (see the module
    docstring). ``fixed``: groups held at a code (dwell). Without any plan that fits, the least-error plan, with
    ``feasible=False``."""
    _check(times, errors, budget, caps)
    ts = [np.asarray(r, dtype=np.float64) for r in times]
    es = [np.asarray(r, dtype=np.float64) for r in errors]
    fixed = dict(fixed or {})
    opts = [np.array([fixed[g]]) if g in fixed else o for g, o in enumerate(_capped(es, undominated(ts, es), caps))]

    def plan(codes: Sequence[int], exact: bool) -> Plan:
        t, e = totals(times, errors, codes)
        return Plan(tuple(int(c) for c in codes), t, e, e <= budget and within_caps(errors, codes, caps), exact)

    first = lagrangian(ts, es, opts, budget)
    if first is None:
        return plan(_choose(_padded(ts, opts, np.inf), _padded(es, opts, np.inf), math.inf).tolist(), exact=True)
    codes, lam = first
    candidates = [plan(repair(ts, es, opts, codes, budget), exact=False)]
    if reference is not None and all(g not in fixed or fixed[g] == c for g, c in enumerate(reference)):
        ref = plan(reference, exact=False)
        if ref.feasible:
            candidates.append(ref)
    incumbent = min(candidates, key=Plan.key)
    best = pareto_search(ts, es, opts, budget, incumbent.time, lam, frontier_cap)
    if best is None:
        return incumbent
    exact = plan(best, exact=True)
    return exact if exact.key() <= incumbent.key() else Plan(incumbent.codes, incumbent.time, incumbent.error,
                                                              incumbent.feasible, True)


def solve_view(times: Sequence[Sequence[float]], errors: Sequence[Sequence[float]], budget: float,
               view: Sequence[Sequence[int]], reference: Optional[Sequence[int]] = None) -> Plan:
    """:func:`solve` over a subset of each group's levels (``ladder.family_view``); codes in and out are indices
    into the full ladders. A reference code outside the view is an error."""
    pos = [{c: i for i, c in enumerate(v)} for v in view]
    ref = None if reference is None else [pos[g][c] for g, c in enumerate(reference)]
    plan = solve([[times[g][c] for c in v] for g, v in enumerate(view)],
                 [[errors[g][c] for c in v] for g, v in enumerate(view)], budget, reference=ref)
    return Plan(tuple(view[g][c] for g, c in enumerate(plan.codes)), plan.time, plan.error, plan.feasible,
                plan.exact)


@dataclass
class Hysteresis:
    """When a new plan replaces the current one: only for a predicted gain of at least ``min_gain`` of the step,
    or when the current plan violates the budget; a group that changed less than ``dwell`` decisions ago keeps
    its level (unless the budget is violated, or holding it would leave the plan predicted slower than a reference
    that fits the budget: then every group may move). A plan other than a reference that fits must also beat the
    reference by ``min_gain`` of the step, else the reference is the plan."""

    groups: int
    min_gain: float = 0.03
    dwell: int = 2
    changed_at: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_gain < 1.0 or self.dwell < 0:
            raise ValueError(f"ds_gravac: min_gain {self.min_gain} must be in [0, 1), dwell {self.dwell} >= 0")
        if not self.changed_at:
            self.changed_at = [-(10 ** 9)] * self.groups

    def step(self, decision: int, current: Sequence[int], times: Sequence[Sequence[float]],
             errors: Sequence[Sequence[float]], budget: float, compute_s: float = 0.0,
             reference: Optional[Sequence[int]] = None, caps: Optional[Sequence[float]] = None
             ) -> tuple[tuple[int, ...], bool]:
        """The codes to use from decision number ``decision`` on, and whether they changed."""
        cur_t, cur_e = totals(times, errors, current)
        violated = cur_e > budget or not within_caps(errors, current, caps)
        fixed = {} if violated else {g: int(c) for g, c in enumerate(current)
                                     if decision - self.changed_at[g] < self.dwell}
        new = solve(times, errors, budget, reference=reference, fixed=fixed, caps=caps)
        if reference is not None:
            ref_t, ref_e = totals(times, errors, reference)
            ref_fits = ref_e <= budget and within_caps(errors, reference, caps)
            if fixed and ref_fits and new.time > ref_t:      # dwell may delay a switch, never lose to the reference
                new = solve(times, errors, budget, reference=reference, caps=caps)
            if ref_fits and ref_t - new.time < self.min_gain * (compute_s + ref_t):
                # the validated uniform level unless leaving it pays min_gain of the step: a plan that
                # differs from it for a few percent trades known accuracy for an error model's promise
                new = Plan(tuple(int(c) for c in reference), ref_t, ref_e, True, new.exact)
        gain = (cur_t - new.time) / (compute_s + cur_t) if compute_s + cur_t > 0 else 0.0
        if tuple(new.codes) == tuple(current) or not (violated or gain >= self.min_gain):
            return tuple(int(c) for c in current), False
        for g, (a, b) in enumerate(zip(current, new.codes)):
            if a != b:
                self.changed_at[g] = decision
        return new.codes, True


__all__ = ["FRONTIER_CAP", "Plan", "Hysteresis", "lagrangian", "undominated", "pareto_search", "repair", "solve",
           "solve_view", "totals", "within_caps"]
