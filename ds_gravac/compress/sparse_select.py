"""Selection kernels shared by the sparsifiers.

Pure functions on flat floating tensors: candidate extraction for a magnitude threshold, exact top-k with a
canonical tie rule, sampled thresholds (the data-dependent threshold searches of DGC, RedSync and SIDCo are in
``sparse_thresholds``). They never touch compressor state, so multi-level stages and tests can call them directly.

Canonical tie rule: among elements whose magnitude equals the k-th largest, the lowest indices win. Every
algorithm here realizes it, so the selected *set* does not depend on the algorithm, and a top-k of a top-k
equals the direct top-k even with ties.

Speed (measured on one core): CPU tensors go through numpy views (zero-copy), whose compaction, comparison
and selection kernels are 3-10x faster than torch's (``np.flatnonzero`` ~0.6 ns/element vs 1-6 ns for
``torch.nonzero``; ``np.partition`` ~0.8 ns vs 6-12 ns for ``torch.topk``; scalar comparisons 4x). Other
devices use the equivalent torch ops.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .device_path import host_kernels

try:
    import numpy as _np
except ImportError:  # pragma: no cover - numpy ships with every supported torch build
    _np = None

Tensor = torch.Tensor

SMALL_N = 1 << 16          # below this, a direct selection beats any threshold scheme (per-op overhead)
CHUNK = 1 << 16            # candidate-pass chunk: |x| and mask scratch stay in L2
Z_SAFETY = 3.0             # sample-quantile safety margin in standard deviations
FP16_MAX = 65504.0


def on_numpy(t: Tensor) -> bool:
    return _np is not None and host_kernels(t)


def flatnonzero(mask: Tensor) -> Tensor:
    """Sorted int64 positions of the true/non-zero entries of a 1-D tensor."""
    if on_numpy(mask):
        return torch.from_numpy(_np.flatnonzero(mask.numpy()))
    return mask.nonzero().squeeze(1)


def count_ge(a: Tensor, thr: float, strict: bool = False) -> int:
    """``#{a >= thr}`` (``> thr`` if strict) without a torch bool temporary on CPU."""
    if on_numpy(a):
        an = a.numpy()
        return int(_np.count_nonzero(an > thr if strict else an >= thr))
    return int((a > thr).sum() if strict else (a >= thr).sum())


# ---- candidate extraction -----------------------------------------------------------------------------
def _cmp(a: Any, thr: float, strict: bool) -> Any:
    return a > thr if strict else a >= thr


def candidates_with_values(x: Tensor, thr: float, strict: bool = False) -> tuple[Tensor, Tensor]:
    """Sorted int64 indices ``i`` with ``|x_i| >= thr`` (``> thr`` if ``strict``) and the values ``x_i``.

    NaN never qualifies. On CPU the pass runs in cache-sized chunks with reused scratch (|x|, mask), so the
    only full-size traffic is one read of x, and the values are picked while the chunk is still in cache.
    (Measured alternatives that lost: a column-max prefilter skipping empty blocks, word-level compaction,
    writing into preallocated outputs instead of concatenating.)
    """
    if not on_numpy(x):
        idx = _cmp(x.abs(), thr, strict).nonzero().squeeze(1)
        return idx, x.index_select(0, idx)
    xn = x.numpy()
    n = xn.size
    if n <= CHUNK:
        idx = _np.flatnonzero(_cmp(_np.abs(xn), thr, strict))
        return torch.from_numpy(idx), torch.from_numpy(xn[idx])
    mag, mask = _np.empty(CHUNK, xn.dtype), _np.empty(CHUNK, bool)
    op = _np.greater if strict else _np.greater_equal
    idx_parts, val_parts = [], []
    for start in range(0, n, CHUNK):
        seg = xn[start:start + CHUNK]
        m = seg.size
        _np.abs(seg, out=mag[:m])
        op(mag[:m], thr, out=mask[:m])
        hits = _np.flatnonzero(mask[:m])
        if hits.size:
            val_parts.append(seg[hits])
            idx_parts.append(hits + start if start else hits)
    if not idx_parts:
        return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=x.dtype)
    if len(idx_parts) == 1:
        return torch.from_numpy(idx_parts[0]), torch.from_numpy(val_parts[0])
    return torch.from_numpy(_np.concatenate(idx_parts)), torch.from_numpy(_np.concatenate(val_parts))


def candidates(x: Tensor, thr: float, strict: bool = False) -> Tensor:
    """Sorted int64 indices ``i`` with ``|x_i| >= thr`` (``> thr`` if ``strict``); NaN never qualifies."""
    if not on_numpy(x):
        return _cmp(x.abs(), thr, strict).nonzero().squeeze(1)
    xn = x.numpy()
    if xn.size <= CHUNK:
        return torch.from_numpy(_np.flatnonzero(_cmp(_np.abs(xn), thr, strict)))
    return candidates_with_values(x, thr, strict)[0]


# ---- exact selection ----------------------------------------------------------------------------------
def kth_largest(a: Tensor, k: int) -> float:
    """The k-th largest value of ``a`` (1 ≤ k ≤ len); NaN sorts above everything."""
    c = a.numel()
    if on_numpy(a):
        return float(_np.partition(a.numpy(), c - k)[c - k])
    if k <= c - k + 1:
        return _kth_of_topk(a, k)
    return float(torch.topk(a, c - k + 1, largest=False, sorted=False).values.max())


def _kth_of_topk(a: Tensor, k: int) -> float:
    """The k-th largest from ``torch.topk``: the smallest of its k values that is not NaN (``min()`` would
    return a NaN among them), NaN only when all k are."""
    top = torch.topk(a, k, sorted=False).values
    top = top[~top.isnan()]
    return float(top.min()) if top.numel() else float("nan")


def _nan_safe_topk(a: Tensor, k: int) -> Tensor:
    """Sorted positions of a top-k treating NaN as largest; used when the k-th value is NaN."""
    if on_numpy(a):
        c = a.numel()
        return torch.from_numpy(_np.sort(_np.argpartition(a.numpy(), c - k)[c - k:]))
    return torch.topk(a, k, sorted=False).indices.sort().values


def _np_select_at(an: Any, thr: float, k: int) -> Any:
    """numpy core of :func:`select_at_threshold`; returns None when NaNs leave fewer than k matches."""
    ge = an < thr                                          # "not below": NaN counts as largest
    _np.logical_not(ge, out=ge)
    if int(_np.count_nonzero(ge)) == k:
        return _np.flatnonzero(ge)
    gt = an <= thr
    _np.logical_not(gt, out=gt)                            # ties at the k-th value: canonical fill
    need = k - int(_np.count_nonzero(gt))
    gt[_np.flatnonzero(an == thr)[:max(0, need)]] = True
    pos = _np.flatnonzero(gt)
    return pos if pos.size == k else None


def _np_topk(an: Any, k: int, may_have_zeros: bool = True) -> Any:
    """Sorted positions of the canonical top-k of the numpy magnitudes ``an`` (NaN counts as largest)."""
    c = an.size
    if k >= c:
        return _np.arange(c)
    if may_have_zeros and int(_np.count_nonzero(an)) <= k:    # see topk_among: partitioning ties at 0 is slow
        return _np_select_at(an, 0.0, k)
    pos = _np_select_at(an, float(_np.partition(an, c - k)[c - k]), k)
    return pos if pos is not None else _np.sort(_np.argpartition(an, c - k)[c - k:])


def select_at_threshold(a: Tensor, thr: float, k: int) -> Tensor:
    """Sorted positions of ``{a > thr}`` plus the lowest-position ``a == thr`` up to exactly k; NaN counts as
    above every threshold (as it does for :func:`kth_largest`), so a NaN is never dropped in favour of a tie."""
    if on_numpy(a):
        pos = _np_select_at(a.numpy(), thr, k)
        return torch.from_numpy(pos) if pos is not None else _nan_safe_topk(a, k)
    ge = (a < thr).logical_not_()
    if int(ge.sum()) == k:
        return ge.nonzero().squeeze(1)
    gt = (a <= thr).logical_not_()
    need = k - int(gt.sum())
    eq = a == thr
    pos = (gt | (eq & (eq.cumsum(0) <= need))).nonzero().squeeze(1)
    return pos if pos.numel() == k else _nan_safe_topk(a, k)   # a NaN k-th value matches nothing


def topk_among(a: Tensor, k: int, may_have_zeros: bool = True) -> Tensor:
    """Sorted positions of the canonical top-k of the magnitudes ``a`` (ties: lowest position first).

    ``may_have_zeros=False`` is for callers whose magnitudes are known to be positive (candidates above a
    positive threshold): it skips the count of non-zeros, one pass over ``a``.
    """
    c = a.numel()
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=a.device)
    if on_numpy(a):
        return torch.from_numpy(_np_topk(a.numpy(), k, may_have_zeros))
    if k >= c:
        return torch.arange(c, device=a.device)
    # torch kernels (a GPU): one stable sort gives the same canonical set without reading a count on the host
    # (a threshold scheme reads the k-th value, and the number of non-zeros, once per call)
    return topk_sort(a, k)


def topk_torch(a: Tensor, k: int) -> Tensor:
    """Canonical top-k whose k-th value comes from ``torch.topk`` (configurable reference algorithm)."""
    if k >= a.numel():
        return torch.arange(a.numel(), device=a.device)
    return select_at_threshold(a, _kth_of_topk(a, k), k)


def topk_kthvalue(a: Tensor, k: int) -> Tensor:
    """Canonical top-k whose k-th value comes from ``torch.kthvalue``."""
    n = a.numel()
    if k >= n:
        return torch.arange(n, device=a.device)
    return select_at_threshold(a, float(torch.kthvalue(a, n - k + 1).values), k)


def topk_sort(a: Tensor, k: int) -> Tensor:
    """Canonical top-k by a stable descending sort (ties keep index order)."""
    return torch.sort(a, descending=True, stable=True).indices[:k].sort().values


# ---- sampling -----------------------------------------------------------------------------------------
def sample_abs(x: Tensor, s: int, gen: torch.Generator) -> Tensor:
    """``s`` magnitudes drawn uniformly with replacement from a dedicated stream, in draw order."""
    pos = torch.randint(x.numel(), (s,), generator=gen, device=x.device)
    return x.index_select(0, pos).abs_()


def largest_at(sample: Tensor, r: int) -> float:
    """The r-th largest sample value (1-based)."""
    return kth_largest(sample, max(1, min(r, sample.numel())))


def sample_size(n: int, k: int) -> int:
    """Threshold-estimation sample for top-k: tight enough that candidates stay near k, cheap next to n.

    Sampled reads are random cache misses (~7 ns each), so 2048 suffice for sparse levels; dense levels
    (k/n ≥ 5%) take 4096 because every excess candidate costs a few selection steps.
    """
    return min(n, 4096 if k * 20 >= n else 2048)


def safe_rank(s: int, q: float, z: float = Z_SAFETY) -> int:
    """Sample rank whose value leaves ≥ q·n elements above it with high probability (z std. deviations)."""
    return int(math.ceil(s * q + z * math.sqrt(s * q * (1.0 - q)) + 2))


def gather(x: Tensor, idx: Tensor) -> Tensor:
    if on_numpy(x):
        return torch.from_numpy(x.numpy()[idx.numpy()])
    return x.index_select(0, idx)


def exact_topk(x: Tensor, k: int, gen: Optional[torch.Generator]) -> tuple[Tensor, Tensor]:
    """(sorted indices, values) of the canonical top-k |x|.

    Large tensors: a threshold from a small sample (chosen low, so ≥ k elements pass with high probability),
    one candidate pass, and an exact selection among the candidates. Correctness never depends on the
    sample: too few candidates lower the threshold (down to 0, i.e. every non-NaN element) and, if NaNs
    still leave fewer than k, the whole tensor is selected directly. Off the host kernels (a GPU) the selection
    is one stable sort instead: the threshold scheme reads counts on the host at every pass, the sort does not.
    """
    n = x.numel()
    if k >= n:
        return torch.arange(n, device=x.device), x.clone()
    if not on_numpy(x):      # the device path: one stable sort, the same canonical set, no host synchronization
        idx = topk_sort(x.abs(), k)
        return idx, x.index_select(0, idx)
    if n < SMALL_N or gen is None or k > n // 4:
        if on_numpy(x):                        # the many small tensors: one conversion, numpy throughout
            xn = x.numpy()
            idx_np = _np_topk(_np.abs(xn), k)
            return torch.from_numpy(idx_np), torch.from_numpy(xn[idx_np])
        idx = topk_among(x.abs(), k)
        return idx, gather(x, idx)
    s = sample_size(n, k)
    sample = sample_abs(x, s, gen)
    r = safe_rank(s, k / n)
    while True:
        thr = largest_at(sample, r) if r <= s else 0.0
        # A zero threshold (most of x is exactly zero, as in an embedding's gradient) takes the non-zeros only:
        # the zeros can matter only as the fill below, and selecting among millions of tied zeros is slow.
        cand, vals = candidates_with_values(x, thr, strict=thr == 0.0)
        if cand.numel() >= k:
            break
        if r > s or thr == 0.0:       # fewer than k non-zeros: all of them, filled with the lowest zeros
            idx = select_at_threshold(x.abs(), 0.0, k)
            return idx, gather(x, idx)
        r = 2 * r + 16
    pos = topk_among(vals.abs(), k, may_have_zeros=False)   # candidates: |v| >= thr > 0, or > 0 (strict)
    return gather(cand, pos), gather(vals, pos)


# ---- payload helpers ----------------------------------------------------------------------------------
def write_entries(idx_view: Tensor, val_view: Tensor, idx: Tensor, vals: Tensor) -> int:
    """Real entries first, then padding ``(0, 0)``; fp16 values are clamped so finite input stays finite."""
    m = idx.numel()
    if val_view.dtype == torch.float16 and vals.dtype != torch.float16:
        vals = vals.clamp(-FP16_MAX, FP16_MAX)
    if on_numpy(idx_view) and on_numpy(vals) and val_view.dtype != torch.float16:
        iv, vv = idx_view.numpy(), val_view.numpy()          # numpy casts/copies with less overhead
        iv[:m] = idx.numpy()
        vv[:m] = vals.numpy()
        if m < iv.size:
            iv[m:] = 0
            vv[m:] = 0
        return m
    idx_view[:m].copy_(idx)
    val_view[:m].copy_(vals)
    if m < idx_view.numel():
        idx_view[m:].zero_()
        val_view[m:].zero_()
    return m


def write_gathered(idx_view: Tensor, val_view: Tensor, idx: Tensor, vals: Tensor, pos: Tensor) -> int:
    """``write_entries(idx[pos], vals[pos])`` gathering straight into the payload views (multi-level)."""
    m = pos.numel()
    if on_numpy(idx_view) and on_numpy(vals) and val_view.dtype == vals.dtype:
        iv, vv, pn = idx_view.numpy(), val_view.numpy(), pos.numpy()
        _np.take(idx.numpy(), pn, out=iv[:m])
        _np.take(vals.numpy(), pn, out=vv[:m])
        if m < iv.size:
            iv[m:] = 0
            vv[m:] = 0
        return m
    return write_entries(idx_view, val_view, gather(idx, pos), gather(vals, pos))


def zero_at(buf: Tensor, idx: Tensor) -> None:
    """``buf[idx] = 0`` for a 1-D buffer (numpy's scatter is ~2x faster than ``index_fill_`` on CPU)."""
    if on_numpy(buf) and on_numpy(idx):
        buf.numpy()[idx.numpy()] = 0
    else:
        buf.index_fill_(0, idx, 0.0)


def real_count(idx_view: Tensor, val_view: Tensor) -> int:
    """Number of real entries of a sparse payload written by this module (real indices strictly increase).

    A lone ``(0, 0)`` entry counts as padding; either reading decodes identically.
    """
    k = idx_view.numel()
    if k == 0:
        return 0
    if on_numpy(idx_view):
        iv = idx_view.numpy()
        m = 1 + int(_np.count_nonzero(iv[1:] > 0))
    else:
        m = 1 + int((idx_view[1:] > 0).sum())
    if m == 1 and int(idx_view[0]) == 0 and float(val_view[0]) == 0.0:
        return 0
    return m


def abs_float(vals: Tensor) -> Tensor:
    """|v| as fp32/fp64 (payload values may be fp16), without torch per-op overhead on CPU."""
    if on_numpy(vals):
        vn = vals.numpy()
        return torch.from_numpy(_np.abs(vn if vn.dtype != _np.float16 else vn.astype(_np.float32)))
    return vals.float().abs()
