"""Sparsifiers (docs/algorithms.md), every one alike: layout, reconstruction, error feedback, determinism,
edge inputs, strict parameters (each algorithm's own rules: test_sparse_selection and test_sparse_dgc)."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress.base import Kind, k_for
from ds_gravac.compress.registry import lookup

from sparse_cases import ALL, EXTERNAL_EF, alloc, ctx_for, decode, encode, laplace, make


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
