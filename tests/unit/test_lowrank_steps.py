"""PowerSGD and ACP-SGD step arithmetic (ds_gravac.compress.lowrank_steps) with W simulated ranks in float64:
the invariants every implementation of the two methods must satisfy, derived from their definitions."""
from __future__ import annotations

import torch

from ds_gravac.compress import lowrank_steps as ls

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def low_rank(n: int, m: int, r: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    return torch.randn(n, r, generator=g, dtype=F64) @ torch.randn(r, m, generator=g, dtype=F64)


def powersgd_step(ms: list[torch.Tensor], es: list[torch.Tensor], q_prev: torch.Tensor
                  ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One PowerSGD step of one matrix on W simulated ranks: (G, new errors, next Q_prev)."""
    w = len(ms)
    xs = [m + e for m, e in zip(ms, es)]
    _, pws = zip(*(ls.powersgd_round1([x], [q_prev]) for x in xs))
    p_sum = sum(p[0] for p in pws)
    rounds = [ls.powersgd_round2([x], [p_sum]) for x in xs]
    q_sum = sum(q[0] for _, q in rounds)
    outs = [ls.powersgd_finish([x], ph, [q_sum], w) for x, (ph, _) in zip(xs, rounds)]
    gs = [o[0][0] for o in outs]
    assert all(torch.equal(g, gs[0]) for g in gs)           # every rank decodes the same G
    return gs[0], [o[1][0] for o in outs], outs[0][2][0]


def acp_step(ms: list[torch.Tensor], es: list[torch.Tensor], shared: torch.Tensor, p_step: bool
             ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """One ACP-SGD step on W simulated ranks: (G, new errors, the aggregated factor = next step's input)."""
    w = len(ms)
    xs = [m + e for m, e in zip(ms, es)]
    if p_step:
        parts = [ls.acp_p_step([x], [shared]) for x in xs]
        agg = sum(p[1][0] for p in parts)
        g = ls.acp_decode_p([agg], parts[0][0], w)[0]
    else:
        parts = [ls.acp_q_step([x], [shared]) for x in xs]
        agg = sum(p[1][0] for p in parts)
        g = ls.acp_decode_q(parts[0][0], [agg], w)[0]
    return g, [p[2][0] for p in parts], agg


# ---- PowerSGD ---------------------------------------------------------------------------------------
def test_powersgd_recovers_a_rank_r_matrix_at_the_first_step() -> None:
    m = low_rank(30, 20, 3, seed=0)
    q0 = torch.randn(20, 4, generator=gen(1), dtype=F64)
    g, es, _ = powersgd_step([m, m.clone()], [torch.zeros_like(m)] * 2, q0)
    assert torch.allclose(g, m, atol=1e-12 * m.abs().max())
    assert all(e.abs().max() < 1e-12 * m.abs().max() for e in es)


def test_powersgd_error_feedback_conserves_the_sum() -> None:
    w, n, m, steps = 3, 12, 9, 20
    es = [torch.zeros(n, m, dtype=F64) for _ in range(w)]
    q = torch.randn(m, 2, generator=gen(5), dtype=F64)
    sent = torch.zeros(n, m, dtype=F64)
    dense = torch.zeros(n, m, dtype=F64)
    for t in range(steps):
        ms = [torch.randn(n, m, generator=gen(100 * t + r), dtype=F64) for r in range(w)]
        g, es, q = powersgd_step(ms, es, q)
        sent += g
        dense += sum(ms) / w
    assert torch.allclose(sent + sum(es) / w, dense, atol=1e-10)


def test_powersgd_full_rank_is_exact_every_step() -> None:
    w, n = 2, 6
    es = [torch.zeros(n, n, dtype=F64) for _ in range(w)]
    q = torch.randn(n, n, generator=gen(2), dtype=F64)
    for t in range(5):
        ms = [torch.randn(n, n, generator=gen(10 * t + r), dtype=F64) for r in range(w)]
        g, es, q = powersgd_step(ms, es, q)
        assert torch.allclose(g, sum(ms) / w, atol=1e-10)


def test_powersgd_is_exact_every_step_when_the_summed_gradient_has_rank_at_most_r() -> None:
    """A Linear layer's gradient over a batch of b samples is a sum of b outer products, so the sum over W ranks
    has rank <= W*b. PowerSGD at r >= W*b then returns the exact average on every step, error feedback included
    (each rank's error is its deviation from the average, and the errors sum to zero) — with a fresh random
    projection every step as with the warm start. What VGG16-bn's recommended config relies on."""
    w, b, n, m = 2, 3, 40, 25
    r = w * b
    for warm in (False, True):
        es = [torch.zeros(n, m, dtype=F64) for _ in range(w)]
        q = torch.randn(m, r, generator=gen(7), dtype=F64)
        for t in range(6):
            ms = [low_rank(n, m, b, seed=100 * t + k) for k in range(w)]
            if not warm:
                q = torch.randn(m, r, generator=gen(1000 + t), dtype=F64)
            g, es, q_next = powersgd_step(ms, es, q)
            assert torch.allclose(g, sum(ms) / w, atol=1e-9), (warm, t)
            assert torch.allclose(sum(es), torch.zeros(n, m, dtype=F64), atol=1e-9)
            q = q_next


def test_powersgd_one_rank_splits_the_input_exactly() -> None:
    x = torch.randn(15, 11, generator=gen(4), dtype=F64)
    q = torch.randn(11, 2, generator=gen(6), dtype=F64)
    g, es, _ = powersgd_step([x], [torch.zeros_like(x)], q)
    assert torch.allclose(g + es[0], x, atol=1e-12)


# ---- ACP-SGD ----------------------------------------------------------------------------------------
def test_acp_rank_r_constant_gradient_is_exact_from_step_two_without_error_feedback() -> None:
    m = low_rank(16, 10, 2, seed=7)
    shared = torch.randn(10, 2, generator=gen(8), dtype=F64)        # the seeded Q_prev, identical on all ranks
    zeros = [torch.zeros_like(m)] * 2
    for t in range(6):
        g, _, shared = acp_step([m, m], zeros, shared, p_step=t % 2 == 0)
        if t >= 1:
            assert torch.allclose(g, m, atol=1e-10 * m.abs().max()), t


def test_acp_error_feedback_pairs_sum_to_twice_the_gradient() -> None:
    m = low_rank(16, 10, 2, seed=9)
    shared = torch.randn(10, 2, generator=gen(10), dtype=F64)
    es = [torch.zeros_like(m)] * 2
    gs = []
    for t in range(6):
        g, es, shared = acp_step([m, m], es, shared, p_step=t % 2 == 0)
        gs.append(g)
        if t % 2 == 1:                                             # after every Q-step the error is gone
            assert all(e.abs().max() < 1e-10 * m.abs().max() for e in es), t
    for k in range(0, 6, 2):
        assert torch.allclose(gs[k] + gs[k + 1], 2 * m, atol=1e-10 * m.abs().max())


def test_acp_error_feedback_conserves_the_sum() -> None:
    w, n, m, steps = 3, 10, 7, 21
    es = [torch.zeros(n, m, dtype=F64) for _ in range(w)]
    shared = torch.randn(m, 2, generator=gen(11), dtype=F64)
    sent, dense = torch.zeros(n, m, dtype=F64), torch.zeros(n, m, dtype=F64)
    for t in range(steps):
        ms = [torch.randn(n, m, generator=gen(1000 + 10 * t + r), dtype=F64) for r in range(w)]
        g, es, shared = acp_step(ms, es, shared, p_step=t % 2 == 0)
        sent += g
        dense += sum(ms) / w
    assert torch.allclose(sent + sum(es) / w, dense, atol=1e-10)


def test_acp_square_full_rank_is_exact_every_step() -> None:
    w, n = 2, 5
    es = [torch.zeros(n, n, dtype=F64) for _ in range(w)]
    shared = torch.randn(n, n, generator=gen(12), dtype=F64)
    for t in range(6):
        ms = [torch.randn(n, n, generator=gen(50 + 10 * t + r), dtype=F64) for r in range(w)]
        g, es, shared = acp_step(ms, es, shared, p_step=t % 2 == 0)
        assert torch.allclose(g, sum(ms) / w, atol=1e-10), t
        assert all(e.abs().max() < 1e-10 for e in es)


def test_acp_different_initial_factors_per_rank_give_a_wrong_first_aggregate() -> None:
    """Why the initial factor must be shared: each rank projects onto its own subspace, and the sum of those
    projections is not the projection of the sum that a shared factor gives."""
    m = low_rank(40, 30, 4, seed=13)
    inits = [torch.randn(30, 4, generator=gen(20 + r), dtype=F64) for r in range(2)]
    xs = [m, m]
    g_shared, _, _ = acp_step(xs, [torch.zeros_like(m)] * 2, inits[0], p_step=True)
    parts = [ls.acp_p_step([x], [q]) for x, q in zip(xs, inits)]
    agg = sum(p[1][0] for p in parts)
    g_mixed = ls.acp_decode_p([agg], parts[0][0], 2)[0]           # rank 0's decode with its own Qh
    assert (g_mixed - g_shared).norm() / g_shared.norm() > 0.3
    # and with a shared factor the next step (a Q-step) is already exact for this rank-4 gradient
    g2, _, _ = acp_step(xs, [torch.zeros_like(m)] * 2, ls.acp_p_step([m], [inits[0]])[1][0] * 2, p_step=False)
    assert torch.allclose(g2, m, atol=1e-10 * m.abs().max())
