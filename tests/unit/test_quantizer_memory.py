"""Quantizer memory: efsignsgd's own, external error feedback's commit semantics, and conservation through a
simulated parameter-server exchange (partition, worker encode, owner merge + re-encode, all decode)."""
from __future__ import annotations

import types
import warnings

import pytest
import torch

from ds_gravac.compress.base import CompressCtx, Payload
from quantizer_cases import alloc, ctx_for, decode, laplace, levels, make


# ---- own memory: efsignsgd ----------------------------------------------------------------------------------------
def test_efsignsgd_update_space_memory() -> None:
    comp = make("efsignsgd")
    n, lr = 300, 0.05
    e = laplace(n, seed=1, scale=0.01)
    e0 = e.clone()
    g = laplace(n, seed=2)
    ctx = ctx_for(comp, n, lr=lr)
    ctx.memory = {"e": e}
    x = torch.empty(n)
    comp.memory.compensate(g, x, ctx)
    assert torch.equal(x, e0 + lr * g) and torch.equal(e, e0)
    p = alloc(comp, n, 32)
    comp.compress(x.clone(), p.plan, p, ctx, update_state=False)
    assert torch.equal(e, e0)
    comp.memory.commit(x, p, ctx)
    assert torch.equal(x, (e0 + lr * g) - decode(comp, p, ctx)), "e ← p − Δ"
    assert float(p["scale"][0]) == pytest.approx(float((e0 + lr * g).double().abs().mean()), rel=1e-6)


def test_efsignsgd_check_engine_warns_unless_plain_sgd() -> None:
    comp = make("efsignsgd")
    w = [torch.nn.Parameter(torch.zeros(3))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comp.check_engine(types.SimpleNamespace(optimizer=torch.optim.SGD(w, lr=0.1)))
    for opt in (torch.optim.SGD(w, lr=0.1, momentum=0.9), torch.optim.Adam(w)):
        with pytest.warns(UserWarning, match="efsignsgd"):
            comp.check_engine(types.SimpleNamespace(optimizer=opt))
    with pytest.warns(UserWarning, match=r"gradient_clipping \(1\) rescales"):    # clipping changes γ·G
        comp.check_engine(types.SimpleNamespace(optimizer=torch.optim.SGD(w, lr=0.1), gradient_clipping=lambda: 1.0))


# ---- external EF: commit semantics ---------------------------------------------------------------------------
EXTERNAL = [("onebit", {}), ("onebit", {"scale": "two_means"}), ("terngrad", {"error_feedback": True}),
            ("ternary", {"error_feedback": True}), ("qsgd", {"error_feedback": True}),
            ("fp16", {"error_feedback": True}), ("bf16", {"error_feedback": True})]


@pytest.mark.parametrize("variant", EXTERNAL, ids=[f"{n}{p}" for n, p in EXTERNAL])
def test_external_ef_commit_now_or_later(variant) -> None:
    comp = make(variant[0], **variant[1])
    x = laplace(777, seed=12)
    theta = levels(comp)[0]
    r1 = x.clone()
    ctx1 = ctx_for(comp, 777, world_size=2, residual=r1)
    p1 = alloc(comp, 777, theta)
    comp.compress(r1, p1.plan, p1, ctx1, update_state=True)          # residual aliases the input
    r2 = torch.full((777,), 9.0)
    x2 = x.clone()
    ctx2 = ctx_for(comp, 777, world_size=2, residual=r2)
    p2 = alloc(comp, 777, theta)
    comp.compress(x2, p2.plan, p2, ctx2, update_state=False)
    assert torch.equal(x2, x) and (r2 == 9.0).all(), "update_state=False mutates nothing"
    comp.memory.commit(x2, p2, ctx2)
    assert torch.equal(p1.words, p2.words) and torch.equal(r1, r2) and torch.equal(x2, x)
    assert torch.allclose(r1 + decode(comp, p1, ctx1), x, rtol=1e-6, atol=1e-6)
    ctx2.error_feedback = False                                       # section-level switch off
    comp.memory.commit(x2, p2, ctx2)
    assert not r2.any()


# ---- the parameter-server exchange -------------------------------------------------------------------------
def ps_run(comp, ranks: int, n: int, steps: int, theta: float, lr: float = 1.0, dtype=torch.float64):
    """Simulate the quantized exchange of one bucket of n elements: partitions of L = ceil(n/N) (the last
    zero-padded), each rank encodes every partition of its compensated input, owner j merges, keeps its server
    residual and re-encodes, every rank decodes every re-encoded payload. Returns (per-step G, mean worker
    memory, server residuals, total mean input); memories at padding positions are dropped every step."""
    part = -(-n // ranks)
    plan = comp.plan(part, theta)
    mem = [torch.zeros(ranks * part, dtype=dtype) for _ in range(ranks)]
    server = [torch.zeros(part, dtype=dtype) for _ in range(ranks)]
    gain = lr if comp.update_space else 1.0
    total_in = torch.zeros(n, dtype=torch.float64)
    gs = []
    for t in range(steps):
        sent = [[None] * ranks for _ in range(ranks)]
        for w in range(ranks):
            g = torch.zeros(ranks * part, dtype=dtype)
            g[:n] = laplace(n, seed=1000 * t + w, dtype=dtype, scale=1.0 + w)
            total_in += gain * g[:n].double() / ranks
            for j in range(ranks):
                seg = slice(j * part, (j + 1) * part)
                ctx = CompressCtx(key=f"b0.p{j}", step=t, rank=w, world_size=ranks, seed=5, lr=lr)
                x = torch.empty(part, dtype=dtype)
                if comp.owns_state:
                    ctx.memory = {comp.Memory.input_slot: mem[w][seg]}
                    comp.memory.compensate(g[seg], x, ctx)
                else:
                    torch.add(g[seg], mem[w][seg], out=x)
                    ctx.residual = x
                p = Payload.allocate(plan)
                comp.compress(x, plan, p, ctx, update_state=True)
                mem[w][seg] = x                                  # adopted after the agreement
                sent[w][j] = p
            mem[w][n:] = 0
        views = [torch.empty(ranks * part, dtype=dtype) for _ in range(ranks)]
        for j in range(ranks):
            seg = slice(j * part, (j + 1) * part)
            owner = CompressCtx(key=f"b0.p{j}", step=t, rank=j, world_size=ranks, seed=5, lr=lr)
            y = torch.empty(part, dtype=dtype)
            keep = comp.server_error_feedback
            comp.merge_decode([sent[w][j] for w in range(ranks)], y, owner, server[j] if keep else None)
            q = Payload.allocate(plan)
            comp.server_encode(y, plan, q, owner)
            if keep:
                comp.server_commit(y, q, owner)
                server[j] = y
            for w in range(ranks):   # after the all-gather every rank decodes the owner's payload
                comp.decompress(q, views[w][seg], accumulate=False, scale=1.0,
                                ctx=CompressCtx(key=f"b0.p{j}", step=t, rank=w, world_size=ranks, lr=lr))
        for v in views[1:]:
            assert torch.equal(v, views[0]), "every rank, the owner included, holds the same G"
        gs.append(views[0][:n].double())
    mem_mean = sum(m[:n].double() for m in mem) / ranks
    return gs, mem_mean, torch.cat(server)[:n].double(), total_in


PS_EF = [("onebit", {}), ("onebit", {"scale": "two_means"}), ("efsignsgd", {}), ("tbq", {"tau": 0.7}),
         ("terngrad", {"error_feedback": True}), ("terngrad", {"error_feedback": True, "stochastic": False}),
         ("ternary", {"error_feedback": True}), ("qsgd", {"error_feedback": True, "bucket_size": 50})]


@pytest.mark.parametrize("variant", PS_EF, ids=[f"{n}{p}" for n, p in PS_EF])
@pytest.mark.parametrize("ranks,n", [(3, 1001), (4, 64)])
def test_ps_error_feedback_conservation(variant, ranks: int, n: int) -> None:
    """Σ_t G_t + (1/N)·Σ_w mem_w(T) + s(T) = Σ_t mean_w input_w(t), float64, 50 steps (update space for
    EF-signSGD: input γ·g)."""
    comp = make(variant[0], **variant[1])
    for theta in levels(comp)[:2]:
        gs, mem_mean, server, total_in = ps_run(comp, ranks, n, 50, theta, lr=0.1)
        lhs = sum(gs) + mem_mean + server
        assert torch.allclose(lhs, total_in, rtol=1e-10, atol=1e-10 * float(total_in.abs().max()))
        assert server.abs().max() > 0 and mem_mean.abs().max() > 0


def test_ps_signsgd_is_a_majority_of_signs_without_memory() -> None:
    comp = make("signsgd")
    gs, mem_mean, server, _ = ps_run(comp, 3, 100, 5, 32)
    assert all(set(g.unique().tolist()) <= {-1.0, 1.0} for g in gs)
    assert not mem_mean.any() and not server.any()


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_half_error_feedback_conservation(name: str) -> None:
    """Summable exchange: G = (1/N)·D(Σ p) = (1/N)·Σ D(p_w) (summability), external EF in float64."""
    comp, ranks, n = make(name, error_feedback=True), 3, 501
    res = [torch.zeros(n, dtype=torch.float64) for _ in range(ranks)]
    total_in = torch.zeros(n, dtype=torch.float64)
    total_g = torch.zeros(n, dtype=torch.float64)
    for t in range(50):
        for w in range(ranks):
            g = laplace(n, seed=77 * t + w, dtype=torch.float64, scale=10.0 ** (w - 1))
            total_in += g / ranks
            x = g + res[w]
            ctx = CompressCtx(key="t", step=t, rank=w, world_size=ranks, residual=x)
            p = Payload.allocate(comp.plan(n, 2))
            comp.compress(x, p.plan, p, ctx, update_state=True)
            comp.decompress(p, total_g, accumulate=True, scale=1.0 / ranks, ctx=ctx)
            res[w] = x
    lhs = total_g + sum(res) / ranks
    assert torch.allclose(lhs, total_in, rtol=1e-10, atol=1e-10 * float(total_in.abs().max()))


def test_efsignsgd_equals_onebit_with_error_feedback_scaled_by_lr() -> None:
    ef, ob = make("efsignsgd"), make("onebit")
    g_ef, m_ef, s_ef, _ = ps_run(ef, 3, 301, 20, 32, lr=0.25)       # a power of two: bitwise
    g_ob, m_ob, s_ob, _ = ps_run(ob, 3, 301, 20, 32)
    for a, b in zip(g_ef, g_ob):
        assert torch.equal(a, 0.25 * b)
    assert torch.equal(m_ef, 0.25 * m_ob) and torch.equal(s_ef, 0.25 * s_ob)
    g_ef, _, _, _ = ps_run(ef, 3, 301, 20, 32, lr=0.1)
    for a, b in zip(g_ef, g_ob):                       # any γ: up to the fp32 rounding of the scales
        assert torch.allclose(a, 0.1 * b, rtol=1e-6, atol=0.0)


def test_server_commit_without_server_memory_leaves_zeros() -> None:
    comp = make("terngrad")
    y = laplace(40, seed=1)
    q = alloc(comp, 40, 16)
    comp.server_encode(y, q.plan, q, ctx_for(comp, 40))
    comp.server_commit(y, q, ctx_for(comp, 40))
    assert not y.any()
