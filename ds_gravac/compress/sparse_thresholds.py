"""Data-dependent threshold searches of the threshold sparsifiers: DGC's sampled and adapted threshold, RedSync's
binary search, SIDCo's multi-stage exponential fits.

Split from ``sparse_select`` (the exact selection kernels they build on) to keep each module to one job; they count
and compact through ``sparse_select``, so both of its branches (numpy on CPU, torch elsewhere) apply here too.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from . import sparse_select as sel

Tensor = torch.Tensor


def dgc_threshold(a: Tensor, k: int, sample: Tensor, up: float, down: float, iters: int
                  ) -> tuple[float, int, int]:
    """DGC step 3: sampled threshold then multiplicative adaptation. Returns (thr, count, iterations)."""
    n, s = a.numel(), sample.numel()
    thr = sel.largest_at(sample, max(1, math.ceil(s * k / n)))
    c = sel.count_ge(a, thr)
    used = 0
    while used < iters:
        if c > up * k:
            thr *= up
        elif c < down * k:
            thr *= down
        else:
            break
        used += 1
        c = sel.count_ge(a, thr)
    return thr, c, used


def redsync_threshold(a: Tensor, k: int, eps: float, max_iters: int) -> tuple[float, int, bool]:
    """RedSync binary search between mean and max magnitude. Returns (thr, count, stopped_early)."""
    if a.numel() == 0:
        return 0.0, 0, False
    mu, top = float(a.mean()), float(a.max())
    lo, hi, it = 0.0, 1.0, 0
    while hi - lo > eps and it < max_iters:
        rho = (lo + hi) / 2
        thr = mu + rho * (top - mu)
        c = sel.count_ge(a, thr, strict=True)
        it += 1
        if k <= c <= 2 * k:
            return thr, c, True
        if c < k:
            hi = rho
        else:
            lo = rho
    thr = mu + lo * (top - mu)
    return thr, sel.count_ge(a, thr, strict=True), False


def exp_tail(values: Tensor, q: float, m0: Optional[float] = None) -> float:
    """Exponential fit of the excess over ``m0`` (default: the minimum): threshold leaving q above it."""
    mu = float(values.mean())
    base = float(values.min()) if m0 is None else m0
    return base - (mu - base) * math.log(q)


def sidco_ratios(delta: float, first: float, stage: float, num_stages: int) -> list[float]:
    """Per-stage keep ratios whose product is ``delta``."""
    if delta >= first or num_stages == 1:
        return [delta]
    if num_stages > 1:
        return [first] + [(delta / first) ** (1.0 / (num_stages - 1))] * (num_stages - 1)
    s = 1 + math.ceil(math.log(delta / first) / math.log(stage) - 1e-12)
    return [first] + [stage] * (s - 2) + [(delta / first) / stage ** (s - 2)]


def exceedances(a: Tensor, thr: float) -> Tensor:
    if sel.on_numpy(a):
        an = a.numpy()
        return torch.from_numpy(an[an > thr])
    return a[a > thr]


def sidco_threshold(a: Tensor, ratios: list[float], cap: int, m0_first: Optional[float] = 0.0) -> float:
    """Multi-stage exponential thresholds: stage 1 fits all of ``a``, later stages only the exceedances.

    Stages stop once the exceedances fit the capacity ``cap``: a further fit could only drop entries
    the payload has room for (e.g. a single non-zero would otherwise always fall below its own fit).
    """
    if a.numel() == 0:
        return 0.0
    thr = exp_tail(a, ratios[0], m0_first)
    exceed = a
    for q in ratios[1:]:
        exceed = exceedances(exceed, thr)
        if exceed.numel() <= cap:
            break
        thr = exp_tail(exceed, q)
    return thr
