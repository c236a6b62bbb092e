"""Selection kernels shared by the sparsifiers (compressors.md §3).

Pure functions on flat fp32 tensors: candidate extraction for a magnitude threshold, exact top-k with a
canonical tie rule, sampled thresholds, and the data-dependent threshold searches of DGC, RedSync and SIDCo.
They never touch compressor state, so the multi-level stages (§7) and tests can call them directly.

Canonical tie rule: among elements whose magnitude equals the k-th largest, the lowest indices win. Every
algorithm below realizes that rule, so the selected *set* does not depend on the algorithm, and a top-k of a
top-k equals the direct top-k even with ties.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

Tensor = torch.Tensor

SMALL_N = 1 << 16          # below this, plain torch.topk beats any threshold scheme (per-op overhead)
MAX_BLOCK = 32              # column-block prefilter height cap (measured best 8-32 on one core)
Z_SAFETY = 3.0              # sample-quantile safety margin in standard deviations


def empty_long(device: torch.device) -> Tensor:
    return torch.empty(0, dtype=torch.long, device=device)


# ---- candidate extraction -----------------------------------------------------------------------------
def _block_height(fraction: float) -> int:
    """Column-block height so that roughly a tenth of the blocks contain a candidate.

    A block is scanned element-wise only if its max |x| passes; with candidate density q about
    1-(1-q)^b of blocks do, so b ~ 0.12/q keeps the element-wise work small (measured on one core).
    """
    if fraction <= 0.0:
        return MAX_BLOCK
    b = 1
    while b * 2 <= min(MAX_BLOCK, 0.12 / fraction):
        b *= 2
    return b


def _plain_candidates(x: Tensor, thr: float, strict: bool) -> Tensor:
    a = x.abs()
    mask = a > thr if strict else a >= thr
    return mask.nonzero().squeeze(1)


def candidates(x: Tensor, thr: float, strict: bool = False, fraction: float = 1.0) -> Tensor:
    """Sorted int64 indices ``i`` with ``|x_i| >= thr`` (``> thr`` if ``strict``); NaN never qualifies.

    ``fraction`` is the expected candidate density. For sparse candidate sets the tensor is viewed as
    ``(b, n/b)`` and each column's max/min is taken first (two streaming reads, no large temporaries), so
    only the few columns holding a candidate are examined element-wise.
    """
    n = x.numel()
    b = _block_height(fraction)
    if b == 1 or n < 4 * b:
        return _plain_candidates(x, thr, strict)
    cols_n = n // b
    head = b * cols_n
    xv = x[:head].view(b, cols_n)
    hi, lo = xv.amax(0), xv.amin(0)
    hit = (hi > thr) | (lo < -thr) if strict else (hi >= thr) | (lo <= -thr)
    cols = hit.nonzero().squeeze(1)
    parts = []
    if cols.numel():
        sub = xv.index_select(1, cols).abs_()
        rc = (sub > thr if strict else sub >= thr).nonzero()
        parts.append(rc[:, 0] * cols_n + cols[rc[:, 1]])   # row-major (row, col) order = index order
    if head < n:
        parts.append(_plain_candidates(x[head:], thr, strict) + head)
    if not parts:
        return empty_long(x.device)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# ---- exact selection among candidates -----------------------------------------------------------------
def kth_largest(a: Tensor, k: int) -> Tensor:
    """The k-th largest value of ``a`` (0-d), by quickselect on whichever side is shorter."""
    c = a.numel()
    if k <= c - k + 1:
        return torch.topk(a, k, sorted=False).values.min()
    return torch.topk(a, c - k + 1, largest=False, sorted=False).values.max()


def _band_kth(a: Tensor, k: int, gen: Optional[torch.Generator]) -> Tensor:
    """k-th largest of a large ``a`` via a sampled band [lo, hi) around it; quickselect runs on the band only."""
    c = a.numel()
    s = min(c, 4096)
    pos = torch.randint(c, (s,), generator=gen, device=a.device)
    sample, _ = torch.sort(a[pos], descending=True)
    p = k / c
    spread = Z_SAFETY * math.sqrt(s * p * (1 - p)) + 2
    r_hi, r_lo = int(s * p - spread), int(math.ceil(s * p + spread))
    hi = sample[r_hi] if r_hi >= 0 else None                     # expect fewer than k elements >= hi
    lo = sample[r_lo] if r_lo < s else None                      # expect at least k elements >= lo
    n_hi = int((a >= hi).sum()) if hi is not None else 0
    if n_hi >= k or lo is None:
        return kth_largest(a, k)
    in_lo = a >= lo
    if int(in_lo.sum()) < k:
        return kth_largest(a, k)
    band = a[in_lo & (a < hi)] if hi is not None else a[in_lo]
    return kth_largest(band, k - n_hi)


def topk_among(a: Tensor, k: int, gen: Optional[torch.Generator] = None) -> Tensor:
    """Positions (sorted) of the canonical top-k of the magnitudes ``a`` (ties: lowest position first)."""
    c = a.numel()
    if k >= c:
        return torch.arange(c, device=a.device)
    if k <= 0:
        return empty_long(a.device)
    thr = _band_kth(a, k, gen) if c >= SMALL_N and gen is not None else kth_largest(a, k)
    return select_at_threshold(a, thr, k)


def select_at_threshold(a: Tensor, thr: Tensor, k: int) -> Tensor:
    """Sorted positions of ``{a > thr}`` plus the lowest-position ``a == thr`` up to exactly k."""
    sel = a >= thr
    if int(sel.sum()) != k:                       # ties at the k-th value (or NaN): canonical fill
        gt = a > thr
        need = k - int(gt.sum())
        eq = a == thr
        sel = gt | (eq & (eq.cumsum(0) <= need))
    return sel.nonzero().squeeze(1)


def nan_safe_topk(a: Tensor, k: int) -> Tensor:
    """torch.topk positions (NaN counts as largest), sorted; used when fewer than k finite candidates exist."""
    return torch.topk(a, k, sorted=False).indices.sort().values


# ---- sampling -----------------------------------------------------------------------------------------
def sample_abs(x: Tensor, s: int, gen: torch.Generator) -> Tensor:
    """``s`` magnitudes drawn uniformly with replacement (rank-local stream), sorted descending."""
    pos = torch.randint(x.numel(), (s,), generator=gen, device=x.device)
    return torch.sort(x[pos].abs(), descending=True).values


def sample_size(n: int) -> int:
    """Threshold-estimation sample for top-k: large enough for a tight quantile, small next to n."""
    return min(n, 16384, max(2048, n >> 7))


def safe_rank(s: int, q: float, z: float = Z_SAFETY) -> int:
    """Sample rank r whose value leaves >= q·n elements above it with high probability."""
    return int(math.ceil(s * q + z * math.sqrt(s * q * (1.0 - q)) + 2))


def exact_topk(x: Tensor, k: int, gen: Optional[torch.Generator]) -> Tensor:
    """Sorted indices of the canonical top-k |x|: sampled low threshold, one candidate pass, exact selection.

    Correctness never depends on the sample: if the threshold admits fewer than k candidates it is lowered
    (down to 0, i.e. every non-NaN element) and, with NaNs, torch.topk decides.
    """
    n = x.numel()
    if k >= n:
        return torch.arange(n, device=x.device)
    if n < SMALL_N or gen is None or k > n // 4:
        return topk_direct(x.abs(), k)
    s = sample_size(n)
    sample = sample_abs(x, s, gen)
    r = safe_rank(s, k / n)
    while True:
        thr = float(sample[r - 1]) if r <= s else 0.0
        cand = candidates(x, thr, fraction=min(1.0, r / s))
        if cand.numel() >= k:
            break
        if r > s:
            return nan_safe_topk(x.abs(), k)
        r = 2 * r + 16
    vals = x.index_select(0, cand).abs_()
    return cand.index_select(0, topk_among(vals, k, gen))


def topk_direct(a: Tensor, k: int) -> Tensor:
    """Canonical top-k of magnitudes ``a`` via torch.topk (the k-th value) and a threshold selection."""
    n = a.numel()
    if k >= n:
        return torch.arange(n, device=a.device)
    res = torch.topk(a, k, sorted=False)
    thr = res.values.min()
    if bool(torch.isnan(thr)):
        return res.indices.sort().values
    return select_at_threshold(a, thr, k)


def topk_sort(a: Tensor, k: int) -> Tensor:
    """Canonical top-k by a stable descending sort (reference algorithm; ties keep index order)."""
    order = torch.sort(a, descending=True, stable=True).indices[:k]
    return order.sort().values


def topk_kthvalue(a: Tensor, k: int) -> Tensor:
    """Canonical top-k from ``kthvalue`` plus a selection filling ties in index order."""
    n = a.numel()
    if k >= n:
        return torch.arange(n, device=a.device)
    thr = torch.kthvalue(a, n - k + 1).values
    if bool(torch.isnan(thr)):
        return nan_safe_topk(a, k)
    return select_at_threshold(a, thr, k)


# ---- threshold searches -------------------------------------------------------------------------------
def dgc_threshold(a: Tensor, k: int, sample: Tensor, up: float, down: float, iters: int
                  ) -> tuple[float, int, int]:
    """DGC step 3: sampled threshold then multiplicative adaptation. Returns (thr, count, iterations)."""
    n, s = a.numel(), sample.numel()
    r = max(1, math.ceil(s * k / n))
    thr = float(sample[min(r, s) - 1])
    c = int((a >= thr).sum())
    used = 0
    while used < iters:
        if c > up * k:
            thr *= up
        elif c < down * k:
            thr *= down
        else:
            break
        used += 1
        c = int((a >= thr).sum())
    return thr, c, used


def redsync_threshold(a: Tensor, k: int, eps: float, max_iters: int) -> tuple[float, int, bool]:
    """RedSync binary search between mean and max magnitude. Returns (thr, count, stopped_early)."""
    mu, top = float(a.mean()), float(a.max()) if a.numel() else 0.0
    lo, hi, it = 0.0, 1.0, 0
    c = -1
    while hi - lo > eps and it < max_iters:
        rho = (lo + hi) / 2
        thr = mu + rho * (top - mu)
        c = int((a > thr).sum())
        it += 1
        if k <= c <= 2 * k:
            return thr, c, True
        if c < k:
            hi = rho
        else:
            lo = rho
    thr = mu + lo * (top - mu)
    return thr, int((a > thr).sum()), False


def exp_tail(values: Tensor, q: float, m0: Optional[float] = None) -> float:
    """Exponential fit of the excess over ``m0`` (default min): threshold leaving a fraction q above it."""
    mu = float(values.mean())
    base = float(values.min()) if m0 is None else m0
    return base - (mu - base) * math.log(q)


def sidco_ratios(delta: float, first: float, stage: float, num_stages: int) -> list[float]:
    """Per-stage keep ratios whose product is ``delta`` (compressors.md §3.6)."""
    if delta >= first or num_stages == 1:
        return [delta]
    if num_stages > 1:
        return [first] + [(delta / first) ** (1.0 / (num_stages - 1))] * (num_stages - 1)
    s = 1 + math.ceil(math.log(delta / first) / math.log(stage) - 1e-12)
    if s <= 1:
        return [delta]
    return [first] + [stage] * (s - 2) + [(delta / first) / stage ** (s - 2)]


def sidco_threshold(a: Tensor, ratios: list[float], m0_first: Optional[float] = 0.0) -> float:
    """Multi-stage exponential thresholds: stage 1 fits all of ``a``, later stages only the exceedances."""
    thr = exp_tail(a, ratios[0], m0_first) if a.numel() else 0.0
    exceed = a
    for q in ratios[1:]:
        exceed = exceed[exceed > thr]
        if exceed.numel() == 0:
            break
        thr = exp_tail(exceed, q)
    return thr
