"""Sparsifiers (docs/algorithms.md): layout, reconstruction, error feedback, selection invariants."""
from __future__ import annotations

import math
import types
import warnings

import pytest
import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress import sparse_thresholds as thresholds
from ds_gravac.compress.base import CompressCtx, Kind, Payload, k_for
from ds_gravac.compress.registry import lookup
from ds_gravac.compress.randomk import random_order
from ds_gravac.sync.buckets import Bucket, Member
from ds_gravac.sync.memory import BucketMemory
from ds_gravac.errors import GravacConfigError

SPARSE = ["topk", "dgc", "redsync", "sidco", "threshold", "graddrop"]
EXTERNAL_EF = ["topk", "randomk", "redsync", "sidco", "threshold", "graddrop"]
ALL = SPARSE + ["randomk"]


# ---- helpers --------------------------------------------------------------------------------------------
def make(name: str, **params):
    cls = lookup(name)
    return cls(cls.Params(**params))


def laplace(n: int, seed: int = 0, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs()) * scale).to(dtype)


def distinct(n: int, seed: int = 0) -> torch.Tensor:
    """Distinct magnitudes with random signs and positions (exact sort references are unambiguous)."""
    g = torch.Generator().manual_seed(seed)
    mags = (torch.randperm(n, generator=g) + 1).float() / n
    signs = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return mags * signs


def ctx_for(key: str = "layer.weight", step: int = 1, rank: int = 0, residual=None, **kw) -> CompressCtx:
    return CompressCtx(key=key, step=step, rank=rank, residual=residual, **kw)


def alloc(comp, numel: int, level: float) -> Payload:
    plan = comp.plan(numel, level)
    return Payload.allocate(plan, torch.float32 if comp.kind == Kind.SUMMABLE else torch.int32)


def tensor_memory(comp, n: int, key: str = "layer.weight", dtype: torch.dtype = torch.float32):
    """The synchronizer's memory for one tensor (production code); its parameter carries the gradient."""
    param = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
    bucket = Bucket(index=0, compressible=True, dtype=dtype)
    bucket.add(Member(index=0, name=key, param=param, compressible=True))
    return BucketMemory(bucket, comp.Memory.slots, comp.Memory.input_slot, dtype=dtype), param


_MEMORIES: dict = {}


def memory_of(comp, n: int, key: str, dtype: torch.dtype):
    k = (id(comp), key)
    if k not in _MEMORIES:
        _MEMORIES[k] = (comp, *tensor_memory(comp, n, key, dtype))   # comp kept alive: ids stay unique
    return _MEMORIES[k][1:]


def encode(comp, x: torch.Tensor, level: float, ctx: CompressCtx, update_state: bool = False):
    """One step of a tensor as the synchronizer runs it: compressors with their own memory stage through the
    memory object, encode, and (``update_state``) commit the sent payload."""
    p = alloc(comp, x.numel(), level)
    if comp.owns_state:
        mem, param = memory_of(comp, x.numel(), ctx.key, x.dtype)
        param.grad = x.detach().clone()
        xs = mem.stage(comp, [ctx], True)
        m = comp.compress(xs[0], p.plan, p, ctx, False)
        if update_state:
            comp.memory.commit(xs[0], p, ctx)
            mem.commit_compressed(comp, [p], [ctx])
        return p, int(m)
    m = comp.compress(x, p.plan, p, ctx, update_state)
    return p, int(m)


def decode(comp, p: Payload, ctx: CompressCtx, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = torch.full((p.plan.numel,), 7.0, dtype=dtype)   # garbage: accumulate=False must overwrite
    comp.decompress(p, out, accumulate=False, scale=1.0, ctx=ctx)
    return out


def selected(comp, p: Payload, ctx: CompressCtx) -> torch.Tensor:
    if comp.kind == Kind.SUMMABLE:
        return comp.indices(p.plan.numel, p.plan, ctx)
    return p["idx"][:sel.real_count(p["idx"], p["val"])].long()


# ---- layout and real entries ------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("n,level", [(1, 10), (7, 3), (33, 1), (1000, 10), (4099, 100), (70001, 1000), (70001, 10)])
def test_layout_and_real_entries(name: str, n: int, level: float) -> None:
    comp = make(name)
    x = laplace(n, seed=n)
    ctx = ctx_for()
    p, m = encode(comp, x.clone(), level, ctx)
    k = k_for(level, n)
    assert p.plan.k == k and p.words.numel() == p.plan.words
    if comp.kind == Kind.SPARSE:
        assert comp.wire_layout(p.plan) == [("idx", torch.int32, k), ("val", torch.float32, k)]
        assert comp.wire_bytes(p.plan) == 8 * k
        idx = p["idx"].long()
        assert 0 <= m <= k and (idx[:m] >= 0).all() and (idx[:m] < n).all()
        assert idx[:m].unique().numel() == m and (idx[1:m] > idx[:max(m - 1, 0)]).all()
        assert (idx[m:] == 0).all() and (p["val"][m:] == 0).all()
        assert sel.real_count(p["idx"], p["val"]) == m or (m == 1 and p["val"][0] == 0)
    else:
        assert comp.wire_layout(p.plan) == [("val", torch.float32, k)] and comp.wire_bytes(p.plan) == 4 * k
        s = comp.indices(n, p.plan, ctx)
        assert m == k and s.numel() == k and s.unique().numel() == k and 0 <= int(s.min()) and int(s.max()) < n
    if name == "topk":
        assert m == k


def test_fp16_values_halve_the_value_bytes_and_keep_rounding_in_the_residual() -> None:
    comp = make("topk", value_dtype="fp16")
    x = laplace(3001, seed=3)
    p = alloc(comp, x.numel(), 10)
    k = p.plan.k
    assert comp.wire_bytes(p.plan) == 4 * k + 4 * math.ceil(k / 2) and p["val"].dtype == torch.float16
    r = x.clone()
    comp.compress(r, p.plan, p, ctx_for(residual=r), update_state=True)
    assert torch.equal(decode(comp, p, ctx_for()) + r, x)
    assert r.abs().max() > 0   # fp16 rounding error stays in r at the selected entries


# ---- reconstruction and conservation --------------------------------------------------------------
@pytest.mark.parametrize("name", EXTERNAL_EF)
@pytest.mark.parametrize("aliased", [True, False])
def test_decode_plus_residual_is_input_bitwise(name: str, aliased: bool) -> None:
    comp = make(name)
    x = laplace(90001, seed=5, scale=0.01)
    for level in (10, 100):
        xin = x.clone()
        r = xin if aliased else torch.full_like(x, 3.0)
        ctx = ctx_for(residual=r)
        p = alloc(comp, x.numel(), level)
        comp.compress(xin, p.plan, p, ctx, update_state=True)
        assert torch.equal(decode(comp, p, ctx) + r, x)
        if not aliased:
            assert torch.equal(xin, x)


@pytest.mark.parametrize("name", EXTERNAL_EF)
def test_commit_later_equals_update_in_compress(name: str) -> None:
    comp = make(name)
    x = laplace(5000, seed=8)
    r1, r2 = x.clone(), x.clone()
    p1, _ = encode(comp, r1, 10, ctx_for(residual=r1), update_state=True)
    p2, _ = encode(comp, r2, 10, ctx_for(residual=r2), update_state=False)
    assert torch.equal(r2, x)   # update_state=False mutates nothing
    comp.memory.commit(r2, p2, ctx_for(residual=r2))
    assert torch.equal(p1.words, p2.words) and torch.equal(r1, r2)


@pytest.mark.parametrize("name", EXTERNAL_EF)
def test_error_feedback_conservation_over_steps(name: str) -> None:
    """Σ_t G_t + (1/N) Σ_w r_w(T) = Σ_t mean_w g_w(t), with a dense step mixed in (float64)."""
    comp, ranks, n, steps = make(name), 3, 1500, 50
    residuals = [torch.zeros(n, dtype=torch.float64) for _ in range(ranks)]
    total_g = torch.zeros(n, dtype=torch.float64)
    total_sent = torch.zeros(n, dtype=torch.float64)
    for t in range(steps):
        level = [10, 100, 3][t % 3]
        agg = torch.zeros(n, dtype=torch.float64)
        for w in range(ranks):
            g = laplace(n, seed=1000 * t + w, dtype=torch.float64, scale=1.0 + w)
            total_g += g / ranks
            x = g + residuals[w]
            if t == 17:                                  # dense step: send x, clear memory
                agg += x
                residuals[w] = torch.zeros_like(x)
                continue
            ctx = ctx_for(step=t, rank=w, residual=x)
            p = alloc(comp, n, level)
            comp.compress(x, p.plan, p, ctx, update_state=True)
            comp.decompress(p, agg, accumulate=True, scale=1.0, ctx=ctx)
            residuals[w] = x
        total_sent += agg / ranks
    lhs = total_sent + sum(residuals) / ranks
    assert torch.allclose(lhs, total_g, rtol=1e-10, atol=1e-10 * float(total_g.abs().max()))


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


# ---- DGC -----------------------------------------------------------------------------------------
def test_dgc_commit_masks_exactly_the_real_selected_indices() -> None:
    comp = make("dgc")
    ctx = ctx_for()
    g = laplace(20000, seed=1)
    mem, param = tensor_memory(comp, g.numel())
    param.grad = g.clone()
    v = mem.stage(comp, [ctx], True)[0]
    u_before, v_before = g.clone(), v.clone()                # u after this step's update (it was 0): g
    p = alloc(comp, g.numel(), 100)
    comp.compress(v.clone(), p.plan, p, ctx, update_state=False)
    assert torch.equal(v, v_before) and not mem.slots["v"].any()   # update_state=False: nothing changed yet
    comp.memory.commit(v, p, ctx)
    mem.commit_compressed(comp, [p], [ctx])
    m = sel.real_count(p["idx"], p["val"])
    idx = p["idx"][:m].long()
    mask = torch.zeros_like(g, dtype=torch.bool)
    mask[idx] = True
    u, vv = mem.slots["u"], mem.slots["v"]
    assert (u[mask] == 0).all() and (vv[mask] == 0).all()
    assert torch.equal(u[~mask], u_before[~mask]) and torch.equal(vv[~mask], v_before[~mask])


def test_dgc_padding_never_masks_index_zero() -> None:
    comp = make("dgc")
    ctx = ctx_for()
    mem, param = tensor_memory(comp, 100)
    param.grad = torch.arange(1.0, 101.0)
    v = mem.stage(comp, [ctx], True)[0]
    p = alloc(comp, 100, 25)                                   # k = 4
    p["idx"].copy_(torch.tensor([5, 9, 0, 0], dtype=torch.int32))
    p["val"].copy_(torch.tensor([6.0, 10.0, 0.0, 0.0]))
    comp.memory.commit(v, p, ctx)
    mem.commit_compressed(comp, [p], [ctx])
    assert mem.slots["v"][0] == 1.0 and mem.slots["u"][0] == 1.0
    assert mem.slots["v"][5] == 0 and mem.slots["v"][9] == 0


def test_dgc_threshold_adaptation_ends_in_band_or_after_max_iters() -> None:
    a = laplace(200000, seed=6).abs()
    gen = torch.Generator().manual_seed(0)
    for k in (200, 2000, 20000):
        sample = a[torch.randint(a.numel(), (2000,), generator=gen)]
        thr, c, used = thresholds.dgc_threshold(a, k, sample, 1.3, 0.7, 10)
        assert c == int((a >= thr).sum())
        assert 0.7 * k <= c <= 1.3 * k or used == 10


def test_dgc_full_sample_equals_topk_of_v() -> None:
    comp = make("dgc", sample_ratio=1.0)
    ctx = ctx_for()
    x = distinct(40000, seed=2)
    mem, param = tensor_memory(comp, x.numel())
    param.grad = x
    v = mem.stage(comp, [ctx], True)[0]
    p = alloc(comp, x.numel(), 100)
    comp.compress(v, p.plan, p, ctx, update_state=False)
    ref = sel.topk_sort(v.abs(), p.plan.k)
    assert torch.equal(p["idx"].long(), ref) and comp.last_adapt_iters[ctx.key] == 0


def test_dgc_theta_one_without_masking_is_momentum_sgd_float64() -> None:
    n, ranks, m, wd, lr = 300, 2, 0.9, 0.01, 0.1
    comps = [make("dgc", momentum=m, momentum_masking=False) for _ in range(ranks)]
    w = laplace(n, seed=99, dtype=torch.float64)
    w_ref, buf = w.clone(), torch.zeros(n, dtype=torch.float64)
    for t in range(12):
        grads = [laplace(n, seed=10 * t + r, dtype=torch.float64) for r in range(ranks)]
        agg = torch.zeros(n, dtype=torch.float64)
        for r, comp in enumerate(comps):
            ctx = ctx_for(step=t, rank=r, world_size=ranks, param=w, weight_decay=wd)
            p, _ = encode(comp, grads[r], 1, ctx, update_state=True)
            comp.decompress(p, agg, accumulate=True, scale=1.0 / ranks, ctx=ctx)
        w = w - lr * agg
        buf = m * buf + sum(grads) / ranks + wd * w_ref
        w_ref = w_ref - lr * buf
        assert torch.allclose(w, w_ref, rtol=1e-6, atol=1e-6)


def test_dgc_conservation_with_velocity_memory() -> None:
    """Σ_t G_t + (1/N) Σ_w v_w(T) = Σ_t mean_w u_w(t), u taken after the momentum update, before masking."""
    n, ranks = 30000, 2
    comps = [make("dgc", local_weight_decay=False) for _ in range(ranks)]
    sent = torch.zeros(n, dtype=torch.float64)
    inputs = torch.zeros(n, dtype=torch.float64)
    for t in range(20):
        for r, comp in enumerate(comps):
            ctx = ctx_for(step=t, rank=r)
            g = laplace(n, seed=7 * t + r, dtype=torch.float64)
            memory, _ = memory_of(comp, n, ctx.key, torch.float64)
            inputs += (0.9 * memory.slots["u"] + g) / ranks      # u after the momentum update, before masking
            level = 1 if t == 5 else 100
            p, _ = encode(comp, g, level, ctx, update_state=True)
            comp.decompress(p, sent, accumulate=True, scale=1.0 / ranks, ctx=ctx)
    mem = sum(memory_of(c, n, "layer.weight", torch.float64)[0].slots["v"] for c in comps) / ranks
    assert torch.allclose(sent + mem, inputs, rtol=1e-6, atol=1e-6 * float(inputs.abs().max()))


def test_dgc_check_engine_and_warmup() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    ok = types.SimpleNamespace(optimizer=torch.optim.SGD(params, lr=0.1, momentum=0.9))
    make("dgc").check_engine(ok)
    wrapped = types.SimpleNamespace(optimizer=types.SimpleNamespace(optimizer=ok.optimizer), basic_optimizer=None)
    make("dgc").check_engine(wrapped)
    for bad, msg in ((torch.optim.Adam(params), "Adam"), (torch.optim.SGD(params, lr=0.1, momentum=0.5), "0.5"),
                     (torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True), "nesterov")):
        with pytest.raises(GravacConfigError, match=msg):
            make("dgc").check_engine(types.SimpleNamespace(optimizer=bad, basic_optimizer=bad))
    comp = make("dgc", warmup_steps=8)
    assert [comp.effective_cf(1000, t) for t in range(10)] == [4, 4, 16, 16, 64, 64, 256, 256, 1000, 1000]
    assert comp.effective_cf(10, 5) == 10


def test_dgc_state_dict_round_trip_and_reset() -> None:
    """DGC's u and v live in the synchronizer's memory object: its state dict round-trips them exactly (the
    world-size rule is the checkpoint loader's, tested with real ranks in tests/distributed/test_checkpoint.py)."""
    from ds_gravac.sync.memory import ErrorFeedbackMemory

    def new():
        comp = make("dgc")
        memory = ErrorFeedbackMemory(comp, error_feedback=True)
        memory.build([_single_bucket(20000)])
        return comp, memory

    def run(comp, memory, steps):
        out = []
        bucket = memory.bucket(0)
        for t in steps:
            ctx = ctx_for(step=t)
            bucket.members[0].param.grad = laplace(20000, seed=t)
            x = bucket.stage(comp, [ctx], True)[0]
            p = alloc(comp, 20000, 100)
            comp.compress(x, p.plan, p, ctx, update_state=True)
            bucket.commit_compressed(comp, [p], [ctx])
            out.append(p.words.clone())
        return out

    straight = run(*new(), range(6))
    first = new()
    run(*first, range(3))
    state = first[1].state_dict()
    assert set(state["slots"]) == {"u", "v"} and set(state["slots"]["u"]) == {"layer.weight"}
    resumed = new()
    resumed[1].load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(run(*resumed, range(3, 6)), straight[3:]))
    resumed[1].reset()
    assert not resumed[1].nonzero()


def _single_bucket(n: int) -> Bucket:
    bucket = Bucket(index=0, compressible=True, dtype=torch.float32)
    bucket.add(Member(index=0, name="layer.weight", param=torch.nn.Parameter(torch.zeros(n)), compressible=True))
    return bucket


# ---- RedSync, SIDCo, threshold/GradDrop ----------------------------------------------------
def test_redsync_deterministic_and_early_stop_band() -> None:
    a = laplace(100000, seed=12).abs()
    stops = 0
    for k in (100, 1000, 5000, 10000):
        thr, c, stopped = thresholds.redsync_threshold(a, k, 0.2, 20)
        assert (thr, c, stopped) == thresholds.redsync_threshold(a, k, 0.2, 20)
        if stopped:
            stops += 1
            assert k <= c <= 2 * k
        assert c == int((a > thr).sum())
    assert stops >= 1
    comp = make("redsync")
    x = laplace(100000, seed=12)
    p1, m = encode(comp, x, 100, ctx_for(rank=0))
    p2, _ = encode(make("redsync"), x, 100, ctx_for(rank=1, step=9))
    assert torch.equal(p1.words, p2.words) and m <= p1.plan.k


@pytest.mark.parametrize("level", [10, 100, 1000])
def test_sidco_candidate_count_within_20_percent_on_laplace(level: float) -> None:
    comp = make("sidco")
    x = laplace(1_000_000, seed=int(level))
    encode(comp, x, level, ctx_for())
    k = k_for(level, x.numel())
    assert abs(comp.last_candidates["layer.weight"] - k) <= 0.2 * k


def test_sidco_stage_ratios_multiply_to_delta() -> None:
    for delta in (0.5, 0.1, 0.01, 0.001, 1e-4):
        for stages in (0, 1, 2, 3):
            assert math.isclose(math.prod(thresholds.sidco_ratios(delta, 0.25, 0.25, stages)), delta, rel_tol=1e-12)
    with pytest.raises(ValueError):
        lookup("sidco").Params(adapt_stages=True)


def test_threshold_and_graddrop_selection_rules() -> None:
    x = laplace(50000, seed=2, scale=0.01)
    comp = make("threshold", tau=0.03)
    p, m = encode(comp, x, 10, ctx_for())
    assert comp.last_candidates["layer.weight"] == int((x.abs() > 0.03).sum()) and m <= p.plan.k
    assert (x.abs()[p["idx"][:m].long()] > 0.03).all()
    gd = make("graddrop", sample_ratio=0.01)
    p, m = encode(gd, x, 100, ctx_for())
    assert m <= p.plan.k and gd.last_candidates["layer.weight"] > 0
    seen = set()
    for step in range(4):                     # the rank-local sample changes with the step
        encode(gd, x, 100, ctx_for(step=step))
        seen.add(gd.last_candidates["layer.weight"])
    assert len(seen) > 1


@pytest.mark.parametrize("name", ["dgc", "redsync", "sidco", "threshold", "graddrop"])
def test_approx_multilevel_subset_of_stage_one(name: str) -> None:
    comp = make(name, tau=0.5) if name == "threshold" else make(name)
    x = laplace(200000, seed=21)
    ctx = ctx_for()
    p1, _ = encode(comp, x, 10, ctx)
    state = ({k: v.clone() for k, v in memory_of(comp, x.numel(), ctx.key, x.dtype)[0].slots.items()}
             if comp.owns_state else {})
    s1 = set(selected(comp, p1, ctx).tolist())
    for level in (100, 1000):
        p2 = alloc(comp, x.numel(), level)
        m2 = int(comp.compress_from(p1, x, p2.plan, p2, ctx))
        s2 = selected(comp, p2, ctx)
        assert m2 == s2.numel() <= p2.plan.k and set(s2.tolist()) <= s1
        assert torch.equal(decode(comp, p2, ctx)[s2], decode(comp, p1, ctx)[s2])
        if name != "threshold":    # informative overlap with a direct selection (≥ 90% expected)
            direct, _ = encode(make(name), x.clone(), level, ctx_for(key="direct"))
            sd = set(selected(comp, direct, ctx).tolist())
            overlap = len(set(s2.tolist()) & sd) / max(1, min(s2.numel(), len(sd)))
            assert overlap >= 0.5
    if comp.owns_state:     # multi-level stages never touch the memory
        after = memory_of(comp, x.numel(), ctx.key, x.dtype)[0].slots
        assert all(torch.equal(after[k], state[k]) for k in ("u", "v"))


# ---- determinism, edge inputs, state -------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_deterministic_given_seed_and_inputs(name: str) -> None:
    x = laplace(100000, seed=31)
    a, _ = encode(make(name), x.clone(), 100, ctx_for(step=4, rank=1, seed=5))
    b, _ = encode(make(name), x.clone(), 100, ctx_for(step=4, rank=1, seed=5))
    assert torch.equal(a.words, b.words)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("case", ["zeros", "constant", "one_hot", "n1", "nan", "inf", "big"])
def test_edge_inputs_give_planned_payloads(name: str, case: str) -> None:
    n = 1 if case == "n1" else 70000
    x = {"zeros": torch.zeros(n), "constant": torch.full((n,), 0.5), "n1": torch.tensor([2.5])}.get(case)
    if x is None:
        x = laplace(n, seed=1)
        if case == "one_hot":
            x = torch.zeros(n)
            x[123] = -4.0
        elif case == "big":
            x = x * 1e30
        else:
            x[77] = float("nan") if case == "nan" else float("inf")
    for level in (1, 10, 1000):
        comp = make(name)
        r = x.clone()
        ctx = ctx_for(residual=r)
        p, m = encode(comp, r, level, ctx, update_state=True)
        assert p.words.numel() == p.plan.words and 0 <= m <= p.plan.k
        if case not in ("nan", "inf"):
            assert torch.isfinite(p.words.view(torch.float32) if comp.kind == Kind.SUMMABLE else p["val"]).all()
            assert torch.isfinite(decode(comp, p, ctx)).all() and torch.isfinite(comp.sent_sq_norm(p, ctx))
        if case == "one_hot" and comp.kind == Kind.SPARSE and name != "threshold":
            assert 123 in p["idx"][:m].tolist()


@pytest.mark.parametrize("name", EXTERNAL_EF)
def test_external_ef_compressors_keep_no_local_state(name: str) -> None:
    comp = make(name)
    state = comp.state_dict()
    assert state == {"replicated": {}, "local": {}}
    comp.load_state_dict(state, world_size_changed=True)
    assert comp.owns_state is False and comp.multilevel == ("exact" if name == "topk" else
                                                            "distribution" if name == "randomk" else "approx")


def test_params_are_strict_and_have_spec_defaults() -> None:
    with pytest.raises(ValueError):
        lookup("topk").Params(algoritm="sort")
    with pytest.raises(ValueError):
        lookup("topk").Params(value_dtype="bf16")
    d = lookup("dgc").Params()
    assert ((d.momentum, d.momentum_masking, d.local_weight_decay, d.sample_ratio, d.adapt_up, d.adapt_down,
             d.max_adapt_iters, d.exact_below, d.clip_norm, d.warmup_steps, d.warmup_stages)
            == (0.9, True, True, 0.01, 1.3, 0.7, 10, 16384, 0.0, 0, 4))
    assert (lookup("redsync").Params().search_eps, lookup("redsync").Params().max_iters) == (0.2, 20)
    s = lookup("sidco").Params()
    assert (s.first_ratio, s.stage_ratio, s.num_stages, s.distribution) == (0.25, 0.25, 0, "exp")
    assert lookup("threshold").Params().tau == 0.01 and lookup("graddrop").Params().sample_ratio == 0.001
    assert lookup("randomk").Params().rescale is False and lookup("randomk").kind == Kind.SUMMABLE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make("redsync").plan(1000, 2)
    assert any("redsync" in str(w.message) for w in caught)
