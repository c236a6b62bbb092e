"""Error models of the goodput controller (``ds_gravac/adapt/auto/error_model.py``) against independent float64
computations: QSGD's added variance against a Monte-Carlo of the real QSGD compressor, the low-rank unsent energy
against a direct projection and the SVD, the sparsifiers' pooled unsent energy against a direct sort."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ds_gravac.adapt.auto.error_model import (UNSENT_MAX, averaged_factor_energies, averaged_qsgd_variance,
                                              efficiency, lowrank_unsent, qsgd_variance, residual_in_flight,
                                              sparse_unsent, sq_norm, svd_unsent, variance_budget)
from ds_gravac.compress.base import CompressCtx, Payload
from ds_gravac.compress.qsgd import QSGD, QSGDParams


def laplace(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()


@pytest.mark.parametrize("levels,cf,block", [(127, 4.0, 128), (7, 8.0, 128), (1, 16.0, 128), (7, 8.0, 10)])
def test_qsgd_variance_matches_monte_carlo_of_the_real_compressor(levels: int, cf: float, block: int) -> None:
    """V = N⁻² Σ_ranks Σ_blocks (ν/s)² Σ p(1−p) equals the mean squared error of the averaged decoded payloads of
    two ranks, measured over 250 independent encodes (within 4 Monte-Carlo standard errors)."""
    comp = QSGD(QSGDParams(levels=levels, bucket_size=block))
    n, trials = 640, 250
    xs = [laplace(n, 1), laplace(n, 2) * 0.5]
    xs[0][200:230] = 0.0                                        # an empty block
    plan = comp.make_plan(n, cf)
    mean_x = (xs[0].double() + xs[1].double()) / 2
    errs = []
    for t in range(trials):
        avg = torch.zeros(n, dtype=torch.float64)
        for w, x in enumerate(xs):
            p = Payload.allocate(plan)
            ctx = CompressCtx(key="b0", step=t, rank=w, world_size=2, seed=7)
            comp.compress(x, plan, p, ctx, update_state=False)
            out = torch.zeros(n)
            comp.decompress(p, out, accumulate=False, scale=1.0, ctx=ctx)
            avg += out.double() / 2
        errs.append(float((avg - mean_x).square().sum()))
    mc, se = float(np.mean(errs)), float(np.std(errs, ddof=1) / math.sqrt(trials))
    model = averaged_qsgd_variance(xs, levels, block)
    assert model > 0
    assert abs(mc - model) <= 4 * se, (mc, model, se)


def test_qsgd_sampled_blocks_are_unbiased_and_all_blocks_exact() -> None:
    x = laplace(128 * 40, 3)
    full = qsgd_variance(x, 7, 128)
    assert qsgd_variance(x, 7, 128, blocks=torch.arange(40)) == pytest.approx(full, rel=1e-12)
    gen = torch.Generator().manual_seed(0)
    draws = [qsgd_variance(x, 7, 128, blocks=torch.randint(40, (8,), generator=gen)) for _ in range(1000)]
    assert float(np.mean(draws)) == pytest.approx(full, rel=0.05)
    assert qsgd_variance(torch.zeros(300), 7) == 0.0
    assert qsgd_variance(x, 127) < qsgd_variance(x, 7) < qsgd_variance(x, 1)


def test_efficiency_and_variance_budget() -> None:
    assert efficiency(3.0, 1.0) == 0.75 and efficiency(0.0, 0.0) == 1.0
    b = variance_budget(3.0, 0.75)
    assert b == pytest.approx(1.0) and efficiency(3.0, b) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        variance_budget(1.0, 0.0)


def test_lowrank_unsent_equals_a_direct_projection_of_the_mean() -> None:
    """‖x̄‖² − Σ_{k≤r} ‖c_k‖² from PowerSGD's averaged factors equals ‖x̄ − Ph_r·Ph_rᵀ·x̄‖² with Ph_r an independent
    QR of the first r columns of P (the per-rank residuals, which the mean cancels, play no part)."""
    gen = torch.Generator().manual_seed(0)
    n, m, width, ranks = 40, 30, 8, 3
    xs = [torch.randn(n, m, generator=gen, dtype=torch.float64) for _ in range(ranks)]
    qh = torch.linalg.qr(torch.randn(m, width, generator=gen, dtype=torch.float64))[0]
    energies = averaged_factor_energies(xs, qh)
    xbar = sum(xs) / ranks
    got = lowrank_unsent(sq_norm(xbar), energies, range(width + 1))
    p = sum(x @ qh for x in xs)
    for r in range(width + 1):
        if r == 0:
            want = float(xbar.square().sum())
        else:
            ph = torch.linalg.qr(p[:, :r])[0]
            want = float((xbar - ph @ (ph.t() @ xbar)).square().sum())
        assert got[r] == pytest.approx(want, rel=1e-10, abs=1e-10)
    with pytest.raises(ValueError):
        lowrank_unsent(1.0, energies, [width + 1])


def test_lowrank_unsent_at_the_top_singular_subspace_is_the_svd_tail() -> None:
    """With the warm start at the top right singular vectors, the unsent energy is Σ_{k>r} σ_k² (Eckart–Young),
    which is also what ``svd_unsent`` returns."""
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(25, 18, generator=gen, dtype=torch.float64) for _ in range(2)]
    xbar = (xs[0] + xs[1]) / 2
    _, s, vh = torch.linalg.svd(xbar)
    energies = averaged_factor_energies(xs, vh.t()[:, :10])
    got = lowrank_unsent(sq_norm(xbar), energies, range(11))
    tail = [float(s[r:].square().sum()) for r in range(11)]
    assert got == pytest.approx(tail, rel=1e-9, abs=1e-9)
    assert svd_unsent(xbar, range(11)) == pytest.approx(tail, rel=1e-12, abs=1e-12)
    assert svd_unsent(xbar, [40]) == [0.0]


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_sparse_unsent_equals_a_direct_sort(ranks: int) -> None:
    """Pooled unsent energy of every nested CF against a direct float64 computation per level: each rank's k
    largest magnitudes (stable sort, ties to the lower index), the mean of what the ranks keep back."""
    rng = np.random.default_rng(ranks)
    n = 1003
    xs = [torch.from_numpy(rng.standard_normal(n)) for _ in range(ranks)]
    xs[0][:50] = 0.25                                           # ties
    cfs = [30.0, 4.0, 100.0, 10.0, 1.0]
    got = sparse_unsent(xs, cfs)
    for cf, value in zip(cfs, got):
        k = min(n, max(1, math.ceil(n / cf - 1e-9)))
        left = np.zeros(n)
        for x in xs:
            a = x.numpy().astype(np.float64)
            keep = np.argsort(-np.abs(a), kind="stable")[:k]
            r = a.copy()
            r[keep] = 0.0
            left += r / ranks
        assert value == pytest.approx(float(left @ left), rel=1e-10, abs=1e-12), cf
    assert got[4] == pytest.approx(0.0, abs=1e-12)
    assert got[2] >= got[0] >= got[3] >= got[1]


def test_lowrank_unsent_from_the_real_powersgd_energies_equals_the_decoded_aggregates_gap() -> None:
    """Two simulated ranks run a real PowerSGD step (payloads summed in place of the all-reduces); the energies it
    records for the aggregate gain give, through ``lowrank_unsent``, ‖x̄ − G‖² of the aggregate it decoded, and the
    lower ranks' values equal projections onto the leading columns of the reduced factor (float64)."""
    from ds_gravac.compress.powersgd import PowerSGD

    n, m, r, ranks = 48, 36, 6, 2
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(n * m, generator=gen) for _ in range(ranks)]
    comps, ctxs, p1s, p2s = [], [], [], []
    for w in range(ranks):
        comp = PowerSGD()
        comp.bind_levels("rank", r)
        comp.wants_energies = True
        ctx = CompressCtx(key="t", rank=w, world_size=ranks, seed=3, shape=(n, m),
                          memory={"error": torch.zeros(n * m)})
        plan = comp.tensor_plan((n, m), r)
        p1 = Payload.allocate(plan, torch.float32)
        comp.compress(xs[w], plan, p1, ctx, update_state=False)
        comps.append(comp), ctxs.append(ctx), p1s.append(p1)
    reduced_p = sum(p.words.clone() for p in p1s)
    for w in range(ranks):
        p1s[w].words.copy_(reduced_p)
        p2 = Payload.allocate(p1s[w].plan.get("round2"), torch.float32)
        comps[w].next_round(xs[w], p1s[w], p2, ctxs[w])
        p2s.append(p2)
    reduced_q = sum(p.words.clone() for p in p2s)
    outs = []
    for w in range(ranks):
        p2s[w].words.copy_(reduced_q)
        out = torch.zeros(n * m)
        comps[w].decompress_rounds(p1s[w], p2s[w], out, 1.0 / ranks, ctxs[w])
        comps[w].memory.commit_aggregate(xs[w].clone(), out, [p1s[w], p2s[w]], ctxs[w])
        outs.append(out)
    energies = comps[0].component_energies(ctxs[0])
    assert torch.equal(energies, comps[1].component_energies(ctxs[1]))        # every rank holds the same
    xbar = (xs[0].double() + xs[1].double()).view(n, m) / ranks
    got = lowrank_unsent(sq_norm(xbar), energies, range(r + 1))
    assert got[r] == pytest.approx(float((xbar - outs[0].double().view(n, m)).square().sum()), rel=1e-5)
    p = reduced_p.double().view(r, n).t()
    for k in range(1, r + 1):
        ph = torch.linalg.qr(p[:, :k])[0]
        assert got[k] == pytest.approx(float((xbar - ph @ (ph.t() @ xbar)).square().sum()), rel=1e-5)


@pytest.mark.parametrize("cf", [4.0, 30.0])
def test_sparse_unsent_equals_the_gap_of_the_real_topk_aggregate(cf: float) -> None:
    """Three ranks encode with the real Top-k compressor and decode the mean of their payloads: the energy the
    aggregate leaves of the mean input is what ``sparse_unsent`` predicts."""
    from ds_gravac.compress.topk import TopK

    comp, n, ranks = TopK(), 70000, 3
    gen = torch.Generator().manual_seed(int(cf))
    xs = [torch.randn(n, generator=gen) * (w + 1) for w in range(ranks)]
    plan = comp.make_plan(n, cf)
    out = torch.zeros(n)
    for w, x in enumerate(xs):
        p = Payload.allocate(plan)
        ctx = CompressCtx(key="t", rank=w, world_size=ranks, seed=1, shape=(n,))
        comp.compress(x, plan, p, ctx, update_state=False)
        comp.decompress(p, out, accumulate=True, scale=1.0 / ranks, ctx=ctx)
    xbar = sum(x.double() for x in xs) / ranks
    want = float((xbar - out.double()).square().sum())
    assert sparse_unsent(xs, [cf])[0] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("u", [0.0, 0.1, 0.5, 0.878, 0.982])
def test_residual_in_flight_is_the_steady_memory_of_error_feedback(u: float) -> None:
    """Iterate the memory of a level that sends the fraction 1 − u of memory + new energy each step,
    ``M ← u·(M + S)``, to its fixed point; the closed form must match it."""
    energy, memory = 3.0, 0.0
    for _ in range(20000):
        memory = u * (memory + energy)
    assert residual_in_flight(u * energy, energy) == pytest.approx(memory, rel=1e-9, abs=1e-12)


def test_residual_in_flight_clamps_and_orders_levels() -> None:
    """Nothing sent is a large finite residual; no energy, no residual; more unsent, more residual; the LSTM's
    embedding at rank 2 (98.2% unsent) holds over seven times the residual of rank 16 (87.8%)."""
    assert residual_in_flight(5.0, 5.0) == pytest.approx(5.0 * UNSENT_MAX / (1.0 - UNSENT_MAX))
    assert math.isfinite(residual_in_flight(7.0, 5.0))
    assert residual_in_flight(1.0, 0.0) == 0.0 and residual_in_flight(-1.0, 2.0) == 0.0
    values = [residual_in_flight(u, 1.0) for u in (0.1, 0.5, 0.878, 0.982)]
    assert values == sorted(values)
    assert values[3] / values[2] > 7.0
