"""Top-k and Random-k selection against references written here: sort order, ties, multilevel prefixes,
inclusion frequencies, unbiased rescaling."""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress.base import Payload, k_for
from ds_gravac.compress.randomk import random_order

from sparse_cases import alloc, ctx_for, decode, distinct, encode, laplace, make


# ---- Top-k ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [5000, 100000])
@pytest.mark.parametrize("algorithm", ["auto", "topk", "kthvalue", "sort"])
def test_topk_equals_sort_reference_on_distinct_magnitudes(n: int, algorithm: str) -> None:
    comp = make("topk", algorithm=algorithm)
    x = distinct(n, seed=n)
    for level in (4, 10, 100, 1000):
        p, m = encode(comp, x, level, ctx_for())
        k = k_for(level, n)
        ref = torch.sort(x.abs(), descending=True).indices[:k].sort().values
        assert m == k and torch.equal(p["idx"].long(), ref) and torch.equal(p["val"], x[ref])


@pytest.mark.parametrize("level", [10, 100, 1000])
def test_topk_keeps_the_largest_magnitudes_and_delta_bound(level: float) -> None:
    comp = make("topk")
    x = laplace(300000, seed=int(level))
    p, m = encode(comp, x, level, ctx_for())
    k = p.plan.k
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[p["idx"].long()] = True
    assert m == k and int(mask.sum()) == k
    assert x.abs()[mask].min() >= x.abs()[~mask].max()
    delta = float(comp.sent_sq_norm(p)) / float(x.double().square().sum())
    assert delta >= k / x.numel()
    assert comp.sent_sq_norm(p).dtype == torch.float64 and comp.sent_sq_norm(p).dim() == 0


def test_topk_ties_are_canonical_across_algorithms_and_sizes() -> None:
    g = torch.Generator().manual_seed(2)
    for n in (3000, 80000):
        x = torch.randint(-4, 5, (n,), generator=g).float()     # heavy ties at every magnitude
        for level in (2, 7, 50):
            k = k_for(level, n)
            outs = [encode(make("topk", algorithm=a), x, level, ctx_for())[0]["idx"] for a in
                    ("auto", "topk", "kthvalue", "sort")]
            assert all(torch.equal(outs[0], o) for o in outs[1:])
            a = x.abs()
            thr = torch.sort(a, descending=True).values[k - 1]
            above = torch.nonzero(a > thr).squeeze(1)
            ties = torch.nonzero(a == thr).squeeze(1)[:k - above.numel()]   # lowest indices win
            assert torch.equal(outs[0].long(), torch.cat([above, ties]).sort().values)


@pytest.mark.parametrize("data", ["laplace", "ties"])
def test_topk_multilevel_equals_direct(data: str) -> None:
    comp = make("topk")
    n = 120000
    x = laplace(n, seed=4) if data == "laplace" else torch.randint(-3, 4, (n,),
                                                                    generator=torch.Generator().manual_seed(4)).float()
    ctx = ctx_for()
    p1, _ = encode(comp, x, 10, ctx)
    for level in (100, 1000):
        p2 = alloc(comp, n, level)
        before = p1.words.clone()
        m2 = int(comp.compress_from(p1, x, p2.plan, p2, ctx))
        direct, _ = encode(comp, x, level, ctx)
        assert m2 == p2.plan.k and torch.equal(p2.words, direct.words) and torch.equal(p1.words, before)


def test_multilevel_rejects_k2_above_k1() -> None:
    comp = make("topk")
    p1 = alloc(comp, 1000, 100)
    comp.compress(laplace(1000), p1.plan, p1, ctx_for(), False)
    p2 = alloc(comp, 1000, 10)
    with pytest.raises(AssertionError):
        comp.compress_from(p1, laplace(1000), p2.plan, p2, ctx_for())


def test_exact_topk_survives_a_bad_sample() -> None:
    """A threshold that admits too few candidates is lowered; the result stays exact."""
    x = torch.zeros(200000)
    x[:50] = torch.arange(1, 51).float()      # the sample almost surely sees only zeros ⇒ thr = 0 path
    gen = torch.Generator().manual_seed(0)
    idx, vals = sel.exact_topk(x, 2000, gen)
    assert idx.numel() == 2000 and set(range(50)) <= set(idx.tolist())
    y = laplace(200000, seed=9)
    y[torch.randperm(200000, generator=gen)[:3000]] *= 1000   # heavy tail the sample under-represents
    idx, _ = sel.exact_topk(y, 2000, torch.Generator().manual_seed(1))
    assert torch.equal(idx, sel.topk_sort(y.abs(), 2000))


# ---- Random-k ------------------------------------------------------------------------------------
def test_randomk_same_indices_on_every_rank_and_new_ones_each_step() -> None:
    comp = make("randomk")
    plan = comp.plan(10007, 10)
    s0 = comp.indices(10007, plan, ctx_for(rank=0, step=5))
    s3 = make("randomk").indices(10007, plan, ctx_for(rank=3, step=5))
    assert torch.equal(s0, s3) and s0.unique().numel() == plan.k
    assert not torch.equal(s0, comp.indices(10007, plan, ctx_for(step=6)))
    assert not torch.equal(s0, comp.indices(10007, plan, ctx_for(step=5, key="other")))


def test_randomk_summable() -> None:
    comp = make("randomk")
    ctx = ctx_for(step=2)
    pa, _ = encode(comp, laplace(5000, seed=1), 10, ctx)
    pb, _ = encode(comp, laplace(5000, seed=2), 10, ctx)
    summed = Payload(pa.plan, pa.words + pb.words)
    assert torch.allclose(decode(comp, summed, ctx), decode(comp, pa, ctx) + decode(comp, pb, ctx), atol=0)


def test_random_order_prefixes_are_nested_and_cover_dense_levels() -> None:
    n = 3001
    full = random_order(n, n, 1, 2, 3, torch.device("cpu"))
    assert torch.equal(full.sort().values, torch.arange(n))
    for k in (1, 10, 1500, 1501, 2999):
        assert torch.equal(random_order(n, k, 1, 2, 3, torch.device("cpu")), full[:k])


def test_randomk_multilevel_inclusion_frequency() -> None:
    comp, n, steps = make("randomk"), 200, 1500
    counts = torch.zeros(n)
    x = laplace(n)
    for t in range(steps):
        ctx = ctx_for(step=t)
        p1, _ = encode(comp, x, 4, ctx)
        p2 = alloc(comp, n, 20)
        comp.compress_from(p1, x, p2.plan, p2, ctx)
        s1, s2 = set(comp.indices(n, p1.plan, ctx).tolist()), comp.indices(n, p2.plan, ctx)
        assert set(s2.tolist()) <= s1 and torch.equal(decode(comp, p2, ctx)[s2], x[s2])
        counts[s2] += 1
    expect = steps * 10 / n                  # k2 = 10
    sigma = math.sqrt(expect * (1 - 10 / n))
    assert (counts - expect).abs().max() < 5 * sigma


def test_randomk_rescale_is_unbiased_and_plain_delta_is_one_over_theta() -> None:
    n, steps = 64, 3000
    x = laplace(n, seed=3)
    with pytest.warns(UserWarning, match="rescale"):
        scaled = make("randomk", rescale=True)
        encode(scaled, x, 8, ctx_for(error_feedback=True))
    assert scaled.gain_kind == "unbiased" and make("randomk").gain_kind == "projection"
    mean = torch.zeros(n, dtype=torch.float64)
    deltas = []
    plain = make("randomk")
    for t in range(steps):
        ctx = ctx_for(step=t, error_feedback=False)
        p, _ = encode(scaled, x, 8, ctx)
        mean += decode(scaled, p, ctx).double() / steps
        q, _ = encode(plain, x, 8, ctx)
        deltas.append(float(plain.sent_sq_norm(q, ctx)) / float(x.double().square().sum()))
    assert torch.allclose(mean, x.double(), atol=0.3 * float(x.abs().max()))
    assert abs(sum(deltas) / steps - 1 / 8) < 0.02
