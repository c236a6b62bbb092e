"""The torch branch of every selection kernel agrees with the numpy branch and with an independent reference.

On CPU the kernels in ``ds_gravac.compress.sparse_select`` run through numpy (less per-op overhead); on a GPU
they run their torch branch, which CPU training never exercises. Here ``on_numpy`` is switched off so the torch
branch runs on the same inputs: sizes around the small-tensor and chunk thresholds, ties, k = 1 and k = n,
all-zero, mostly-zero (fewer non-zeros than k) and negative values, and a NaN.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress import sparse_thresholds as thresholds

SIZES = [1, 7, 1000, sel.SMALL_N - 1, sel.SMALL_N + 5, 3 * sel.CHUNK + 17]


def inputs() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for n in SIZES:
        out.append((f"laplace{n}", torch.distributions.Laplace(0.0, 1.0).sample((n,)).float()))
        out.append((f"ties{n}", torch.randint(-3, 4, (n,), generator=gen).float()))
    out.append(("zeros", torch.zeros(5000)))
    for n in (1000, 3 * sel.CHUNK + 17):                 # an embedding's gradient: most rows untouched, exact zeros
        mostly_zero = torch.randn(n, generator=gen)
        mostly_zero[torch.rand(n, generator=gen) < 0.93] = 0.0
        out.append((f"mostly_zero{n}", mostly_zero))
    just_over = torch.randn(3 * sel.CHUNK + 17, generator=gen)   # 11% non-zero: the sampled threshold at k = 10%
    just_over[torch.rand(just_over.numel(), generator=gen) < 0.89] = 0.0   # is 0, yet ≥ k non-zeros exist
    out.append(("just_over_k_nonzero", just_over))
    out.append(("negative", -torch.rand(5000, generator=gen) - 1.0))
    for n in (1000, sel.SMALL_N + 5):                       # fp64 gradients take the same kernels
        out.append((f"float64_{n}", torch.randn(n, generator=gen, dtype=torch.float64)))
    return out


CASES = inputs()


def torch_only(m: pytest.MonkeyPatch) -> None:
    """Force the torch branch; numpy is also hidden, so a numpy call outside the switch would fail loudly."""
    m.setattr(sel, "on_numpy", lambda t: False)
    m.setattr(sel, "_np", None)


def both(fn: Callable[..., Any], *args: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(numpy-branch result, torch-branch result) of ``fn(*args)``; tensor arguments are copied per branch."""
    def fresh() -> list[Any]:
        return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    first = fn(*fresh())
    with monkeypatch.context() as m:
        torch_only(m)
        second = fn(*fresh())
    return first, second


def reference_topk(a: torch.Tensor, k: int) -> torch.Tensor:
    """Canonical top-k of magnitudes ``a`` (ties: lowest position first), by a float64 stable sort."""
    return torch.sort(a.double(), descending=True, stable=True).indices[:k].sort().values


def check_against_torch_topk(a: torch.Tensor, k: int, expected: torch.Tensor) -> None:
    """The reference itself against ``torch.topk``: same value multiset, and same positions without ties."""
    top = torch.topk(a, k)
    assert torch.equal(a[expected].sort().values, top.values.sort().values), k
    if int((a == top.values.min()).sum()) == 1:             # no tie at the k-th value: the set is unique
        assert torch.equal(top.indices.sort().values, expected), k


def ks(n: int) -> list[int]:
    return sorted({1, max(1, n // 100), max(1, n // 10), n // 4 or 1, n})


@pytest.mark.parametrize("name, x", CASES, ids=[c[0] for c in CASES])
def test_exact_selection(name: str, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    a = x.abs()
    for k in ks(x.numel()):
        expected = reference_topk(a, k)
        check_against_torch_topk(a, k, expected)
        for fn in (sel.topk_among, sel.topk_torch, sel.topk_kthvalue, sel.topk_sort):
            got_np, got_torch = both(fn, a, k, monkeypatch=monkeypatch)
            assert torch.equal(got_torch.long(), expected), (fn.__name__, k)
            assert torch.equal(got_np.long(), expected), (fn.__name__, k)
        kth_np, kth_torch = both(sel.kth_largest, a, k, monkeypatch=monkeypatch)
        assert kth_np == kth_torch == float(a.double().sort(descending=True).values[k - 1])
        thr = kth_np
        sel_np, sel_torch = both(sel.select_at_threshold, a, thr, k, monkeypatch=monkeypatch)
        assert torch.equal(sel_np.long(), expected) and torch.equal(sel_torch.long(), expected)
        for gen_seed in (None, 3):
            gen = None if gen_seed is None else torch.Generator().manual_seed(gen_seed)
            gen2 = None if gen_seed is None else torch.Generator().manual_seed(gen_seed)
            idx_np, val_np = sel.exact_topk(x.clone(), k, gen)
            with monkeypatch.context() as m:
                torch_only(m)
                idx_t, val_t = sel.exact_topk(x.clone(), k, gen2)
            assert torch.equal(idx_t.long(), expected) and torch.equal(idx_np.long(), expected), (k, gen_seed)
            assert torch.equal(val_t, x[expected]) and torch.equal(val_np, x[expected])


@pytest.mark.parametrize("name, x", CASES, ids=[c[0] for c in CASES])
def test_candidates_counts_and_gathers(name: str, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    a = x.abs()
    for thr in (0.0, float(a.median()), float(a.max())):
        for strict in (False, True):
            mask = a > thr if strict else a >= thr
            expected = mask.nonzero().squeeze(1)
            (c_np, v_np), (c_t, v_t) = both(sel.candidates_with_values, x, thr, strict, monkeypatch=monkeypatch)
            assert torch.equal(c_np.long(), expected) and torch.equal(c_t.long(), expected)
            assert torch.equal(v_np, x[expected]) and torch.equal(v_t, x[expected])
            c2_np, c2_t = both(sel.candidates, x, thr, strict, monkeypatch=monkeypatch)
            assert torch.equal(c2_np.long(), expected) and torch.equal(c2_t.long(), expected)
            n_np, n_t = both(sel.count_ge, a, thr, strict, monkeypatch=monkeypatch)
            assert n_np == n_t == int(mask.sum())
        f_np, f_t = both(sel.flatnonzero, (a >= thr), monkeypatch=monkeypatch)
        assert torch.equal(f_np.long(), f_t.long())
        e_np, e_t = both(thresholds.exceedances, a, thr, monkeypatch=monkeypatch)
        assert torch.equal(e_np, a[a > thr]) and torch.equal(e_t, a[a > thr])
    idx = torch.arange(0, x.numel(), 3)
    g_np, g_t = both(sel.gather, x, idx, monkeypatch=monkeypatch)
    assert torch.equal(g_np, x[idx]) and torch.equal(g_t, x[idx])
    ab_np, ab_t = both(sel.abs_float, x.half(), monkeypatch=monkeypatch)
    assert torch.equal(ab_np, ab_t) and torch.equal(ab_t, x.half().float().abs())


@pytest.mark.parametrize("val_dtype", [torch.float32, torch.float16])
def test_payload_writers(val_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    idx = torch.tensor([2, 5, 9, 40], dtype=torch.int64)
    vals = torch.randn(4, generator=gen) * 1e5          # beyond fp16's range: clamped, never Inf
    for cap in (4, 7):
        outs = []
        for numpy_on in (True, False):
            iv, vv = torch.full((cap,), -1, dtype=torch.int32), torch.full((cap,), 7.0, dtype=val_dtype)
            with monkeypatch.context() as m:
                if not numpy_on:
                    torch_only(m)
                assert sel.write_entries(iv, vv, idx, vals) == 4
                assert sel.real_count(iv, vv) == 4
            outs.append((iv, vv))
        (iv_np, vv_np), (iv_t, vv_t) = outs
        assert torch.equal(iv_np, iv_t) and torch.equal(vv_np, vv_t)
        assert iv_t[:4].tolist() == [2, 5, 9, 40] and iv_t[4:].eq(0).all() and vv_t[4:].eq(0).all()
        assert torch.isfinite(vv_t).all()
        pos = torch.tensor([0, 2, 3])
        outs = []
        for numpy_on in (True, False):
            iv, vv = torch.full((cap,), -1, dtype=torch.int32), torch.full((cap,), 7.0, dtype=val_dtype)
            with monkeypatch.context() as m:
                if not numpy_on:
                    torch_only(m)
                assert sel.write_gathered(iv, vv, idx, vals.to(val_dtype), pos) == 3
            outs.append((iv, vv))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        assert outs[1][0][:3].tolist() == [2, 9, 40]


def test_zero_at_and_empty_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = torch.arange(1.0, 11.0)
    idx = torch.tensor([0, 3, 9])
    a, b = both(lambda t, i: (sel.zero_at(t, i), t)[1], buf, idx, monkeypatch=monkeypatch)
    expected = buf.clone()
    expected[idx] = 0
    assert torch.equal(a, expected) and torch.equal(b, expected)
    empty = (torch.zeros(3, dtype=torch.int32), torch.zeros(3))
    assert both(sel.real_count, *empty, monkeypatch=monkeypatch) == (0, 0)


def test_nan_counts_as_largest_in_both_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    a = torch.tensor([0.5, float("nan"), 2.0, 1.0, 0.1])
    for k in (1, 2, 3):
        got_np, got_t = both(sel.topk_among, a, k, monkeypatch=monkeypatch)
        assert torch.equal(got_np.long(), got_t.long())
        assert 1 in got_t.tolist()                           # the NaN position is always selected


@pytest.mark.parametrize("name, x", CASES, ids=[c[0] for c in CASES])
def test_threshold_searches(name: str, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    """DGC, RedSync and SIDCo thresholds reach the branches through count_ge, kth_largest and exceedances; the
    returned counts are checked against a direct count, so both branches are also right, not only equal."""
    a = x.abs()
    n = a.numel()
    sample = sel.sample_abs(x, sel.sample_size(n, max(1, n // 100)), torch.Generator().manual_seed(5))
    for k in sorted({1, max(1, n // 100), max(1, n // 4)}):
        for r in (1, max(1, sample.numel() // 3), sample.numel()):
            l_np, l_t = both(sel.largest_at, sample, r, monkeypatch=monkeypatch)
            assert l_np == l_t == float(sample.double().sort(descending=True).values[r - 1])
        d_np, d_t = both(thresholds.dgc_threshold, a, k, sample, 1.3, 0.7, 10, monkeypatch=monkeypatch)
        assert d_np == d_t and d_t[1] == int((a >= d_t[0]).sum()), (k, d_np, d_t)
        r_np, r_t = both(thresholds.redsync_threshold, a, k, 0.2, 20, monkeypatch=monkeypatch)
        assert r_np == r_t and r_t[1] == int((a > r_t[0]).sum()), (k, r_np, r_t)
        ratios = thresholds.sidco_ratios(k / n, 0.25, 0.25, 3)
        s_np, s_t = both(thresholds.sidco_threshold, a, ratios, k, monkeypatch=monkeypatch)
        assert s_np == s_t, (k, s_np, s_t)


def test_nan_safe_topk_both_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback used when the k-th value is NaN (nothing equals it): NaNs first, then the largest values."""
    a = torch.tensor([0.5, float("nan"), 2.0, float("nan"), 1.0, 0.1])
    for k, expected in ((1, None), (2, [1, 3]), (3, [1, 2, 3]), (4, [1, 2, 3, 4]), (6, list(range(6)))):
        got_np, got_t = both(sel._nan_safe_topk, a, k, monkeypatch=monkeypatch)
        for got in (got_np, got_t):
            assert got.numel() == k and got.tolist() == sorted(got.tolist())
            if expected is None:
                assert got.tolist()[0] in (1, 3)
            else:
                assert got.tolist() == expected


def test_nan_among_mostly_zeros_is_selected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer non-zeros than k: every non-zero, the NaN included (it counts as largest), then the lowest zeros."""
    a = torch.zeros(1000)
    a[5], a[7] = float("nan"), 1.0
    got_np, got_t = both(sel.topk_among, a, 3, monkeypatch=monkeypatch)
    assert got_np.tolist() == got_t.tolist() == [0, 5, 7]


def stable_reference(a: torch.Tensor, k: int) -> list[int]:
    """Canonical top-k in float64 by a stable sort, NaN first (it counts as largest), ties lowest position first."""
    key = a.double().nan_to_num(nan=float("inf"), posinf=float("inf"))
    return sorted(torch.sort(key, descending=True, stable=True).indices[:k].tolist())


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_nan_with_ties_at_the_kth_value(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN above ties at the k-th value: the NaN is selected and the ties fill the rest, lowest position first.
    Before the fix, ``>= thr`` counted exactly k matches (the ties) and returned them without the NaN."""
    a = torch.tensor([0.5, float("nan"), 1.0, 1.0, 0.1, 1.0])
    for fn in (sel.topk_among, sel.topk_torch, sel.topk_kthvalue):
        got_np, got_t = both(fn, a, k, monkeypatch=monkeypatch)
        assert got_np.tolist() == got_t.tolist() == stable_reference(a, k), (fn.__name__, k)


def test_topk_among_without_zero_check_keeps_the_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers that pass strictly positive candidates skip the zero count; the selection is the same."""
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(50_000, generator=gen) + 1e-3
    a[::7] = a[3]                                          # ties
    for k in (1, 100, 7_000):
        got_np, got_t = both(lambda t, kk: sel.topk_among(t, kk, may_have_zeros=False), a, k, monkeypatch=monkeypatch)
        assert got_np.tolist() == got_t.tolist() == stable_reference(a, k)
