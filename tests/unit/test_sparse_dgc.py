"""DGC, RedSync, SIDCo and threshold/GradDrop selection: masking, threshold adaptation, momentum equivalence
in float64, state round trips, stage ratios and candidate counts."""
from __future__ import annotations

import math
import types

import pytest
import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress import sparse_thresholds as thresholds
from ds_gravac.compress.base import k_for
from ds_gravac.compress.registry import lookup
from ds_gravac.sync.buckets import Bucket, Member
from ds_gravac.errors import GravacConfigError

from sparse_cases import alloc, ctx_for, decode, distinct, encode, laplace, make, memory_of, selected, tensor_memory


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
