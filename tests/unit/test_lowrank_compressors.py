"""PowerSGD and ACP-SGD as compressors, single process: plans and bytes, the CF → rank mapping used under GraVAC,
prefix payloads and gains (one projection at the largest rank gives every lower rank's gain), and the codec path
with probes, against projections computed separately (float64 where it matters)."""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.compress.acpsgd import ACPSGD
from ds_gravac.compress.base import CompressCtx, Payload
from ds_gravac.compress.lowrank import orthogonalize, seeded_factor
from ds_gravac.compress.powersgd import PowerSGD
from ds_gravac.sync.buckets import Bucket, Member
from ds_gravac.sync.codec import BucketCodec
from lowrank_bytes import rank_for_cf


@pytest.mark.parametrize("cls,pair", [(PowerSGD, 1.0), (ACPSGD, 2.0)])
def test_cf_levels_map_to_the_largest_rank_reaching_the_cf(cls: type, pair: float) -> None:
    comp = cls()
    comp.bind_levels("cf", 2.0)
    for n, m in ((512, 4608), (64, 64), (10, 2048), (1000, 3)):
        for theta in (2.0, 3.5, 10.0, 57.0, 100.0, 1000.0):
            assert comp.rank_for(n, m, theta) == rank_for_cf(n, m, theta, pair), (n, m, theta)


def test_rank_levels_are_capped_by_the_matrix() -> None:
    comp = PowerSGD()
    comp.bind_levels("rank", 4)
    assert comp.rank_for(64, 64, 4) == 4 and comp.rank_for(3, 100, 4) == 3 and comp.rank_for(64, 2, 4) == 2


@pytest.mark.parametrize("shape,level,kind", [((64, 32), 2, "p"), ((10, 10), 4, "plain"), ((128, 3, 3, 3), 4, "p")])
def test_plans_follow_pytorchs_rule_and_the_wire_formulas(shape: tuple, level: int, kind: str) -> None:
    n, m = shape[0], math.prod(shape[1:])
    r = min(level, n, m)
    for comp in (PowerSGD(), ACPSGD()):
        comp.bind_levels("rank", level)
        plan = comp.tensor_plan(shape, level)
        pays = (n + m) * r * 2.0 < n * m
        assert pays == (kind == "p")
        if not pays:
            assert plan.values_sent == n * m and comp.wire_bytes(plan) == 4 * n * m
        elif isinstance(comp, PowerSGD):
            assert plan.values_sent == (n + m) * r and comp.wire_bytes(plan) == 4 * (n + m) * r
        else:
            assert plan.values_sent == n * r and comp.wire_bytes(plan) == 4 * n * r
            comp.phase = 1
            q_plan = comp.tensor_plan(shape, level)
            assert q_plan.values_sent == m * r and comp.wire_bytes(q_plan) == 4 * m * r


def _bucket(shapes: list[tuple[int, ...]], seed: int = 0) -> tuple[Bucket, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    bucket = Bucket(index=0, compressible=True, dtype=torch.float32)
    xs = []
    for i, s in enumerate(shapes):
        p = torch.nn.Parameter(torch.zeros(s))
        bucket.add(Member(index=i, name=f"t{i}", param=p, compressible=True))
        xs.append(torch.randn(math.prod(s), generator=gen))
    return bucket, xs


@pytest.mark.parametrize("cls,phase", [(PowerSGD, 0), (ACPSGD, 0), (ACPSGD, 1)])
def test_probe_gains_equal_separately_computed_projections(cls: type, phase: int) -> None:
    """GraVAC over ranks: the codec measures θ_min directly (the largest rank) and derives the higher CFs as
    prefixes; every level's ‖C(x)‖² equals ‖X·orth(F[:, :r])‖² computed on its own in float64."""
    shapes = [(96, 80), (64, 200), (30, 30)]
    comp = cls()
    comp.bind_levels("cf", 4.0)
    comp.phase = phase
    bucket, xs = _bucket(shapes)
    ctxs = [CompressCtx(key=m.name, param=m.param, shape=tuple(m.param.shape)) for m in bucket.members]
    codec = BucketCodec(bucket, comp, ctxs)
    probes = (4.0, 8.0, 16.0, 64.0)
    _, st = codec.encode(xs, None, probes, [True] * len(probes))
    for slot, theta in enumerate(probes):
        want = 0.0
        for (n, m), x, ctx in zip(shapes, xs, ctxs):
            r = rank_for_cf(n, m, theta, comp.pair_factor)
            width = comp.width(n, m)
            if (n + m) * r * 2.0 >= n * m:           # plain: the whole input counts
                want += float(x.double().square().sum())
                continue
            side, rows = ("q", m) if phase == 0 else ("p", n)
            f = seeded_factor(0, f"{ctx.key}:{side}", rows, width, dtype=torch.float64)
            basis = orthogonalize(f[:, :r])                    # the prefix's own QR, not a slice of the wider one
            xm = x.double().view(n, m)
            want += float((xm @ basis if phase == 0 else xm.t() @ basis).square().sum())
        assert st.nums[slot] == pytest.approx(want, rel=1e-5), (theta, st.nums[slot], want)


@pytest.mark.parametrize("cls", [PowerSGD, ACPSGD])
def test_derived_lower_rank_payload_equals_the_direct_one(cls: type) -> None:
    comp = cls()
    comp.bind_levels("rank", 6)
    x = torch.randn(50 * 40, generator=torch.Generator().manual_seed(3))
    ctx = CompressCtx(key="w", param=torch.nn.Parameter(torch.zeros(50, 40)), shape=(50, 40))
    hi, lo = comp.tensor_plan((50, 40), 6), comp.tensor_plan((50, 40), 2)
    p_hi, p_lo, p_derived = (Payload.allocate(hi, torch.float32), Payload.allocate(lo, torch.float32),
        Payload.allocate(lo, torch.float32))
    comp.compress(x, hi, p_hi, ctx, update_state=False)
    comp.compress(x, lo, p_lo, ctx, update_state=False)
    comp.compress_from(p_hi, x, lo, p_derived, ctx)
    torch.testing.assert_close(p_derived.words, p_lo.words, rtol=1e-6, atol=1e-6)   # BLAS blocks differ by width
    assert float(comp.sent_sq_norm(p_lo)) == pytest.approx(float(p_lo.words.double().square().sum()))


def test_acp_error_is_the_input_minus_the_local_approximation() -> None:
    """ACP's commit leaves X − P_w·Qhᵀ (P-step): orthogonal to the shared basis, so ‖X‖² = ‖E‖² + ‖P_w‖²."""
    comp = ACPSGD()
    comp.bind_levels("rank", 3)
    x = torch.randn(40 * 30, generator=torch.Generator().manual_seed(5), dtype=torch.float32)
    ctx = CompressCtx(key="w", param=torch.nn.Parameter(torch.zeros(40, 30)), shape=(40, 30))
    plan = comp.tensor_plan((40, 30), 3)
    p = Payload.allocate(plan, torch.float32)
    comp.compress(x, plan, p, ctx, update_state=False)
    e = x.clone()
    comp.memory.commit(e, p, ctx)
    qh = orthogonalize(seeded_factor(0, "w:q", 30, 3, dtype=torch.float64))
    assert torch.allclose(e.double().view(40, 30) @ qh, torch.zeros(40, 3, dtype=torch.float64), atol=1e-5)
    assert float(x.double().square().sum()) == pytest.approx(
        float(e.double().square().sum() + p["f"].double().square().sum()), rel=1e-5)


def test_powersgd_zero_input_stays_finite_with_gram_schmidt() -> None:
    """A zero gradient (e.g. an unused layer) gives a zero P; its orthogonalization must not produce NaN."""
    comp = PowerSGD(PowerSGD.Params(orthogonalize="gram_schmidt"))
    comp.bind_levels("rank", 2)
    ctx = CompressCtx(key="w", param=torch.nn.Parameter(torch.zeros(20, 30)), shape=(20, 30))
    plan = comp.tensor_plan((20, 30), 2)
    p1 = Payload.allocate(plan, torch.float32)
    p2 = Payload.allocate(plan.get("round2"), torch.float32)
    x = torch.zeros(600)
    comp.compress(x, plan, p1, ctx, update_state=False)
    comp.next_round(x, p1, p2, ctx)
    out = torch.empty(600)
    comp.decompress_rounds(p1, p2, out, 0.5, ctx)
    assert torch.isfinite(out).all() and not out.any()


@pytest.mark.parametrize("cls", [PowerSGD, ACPSGD])
def test_a_rank_below_the_factor_width_orthogonalizes_only_its_leading_columns(
        cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Factors 64 wide (``auto``'s ladder, GraVAC's θ_min) and a step at rank 16: the QR reads the factor's 16
    leading columns only (a 64-wide QR of every factor each step was half of ``auto``'s compress time), and the
    payload equals ``X·orth(F[:, :16])`` computed in float64; a later rank-64 step widens the cached basis."""
    import ds_gravac.compress.lowrank_base as base

    widths: list[int] = []
    real = base.orthogonalize
    monkeypatch.setattr(base, "orthogonalize", lambda a, *args: widths.append(a.shape[-1]) or real(a, *args))
    n, m = 300, 500
    comp = cls()
    comp.bind_levels("rank", 64)
    x = torch.randn(n * m, generator=torch.Generator().manual_seed(7))
    ctx = CompressCtx(key="w", param=torch.nn.Parameter(torch.zeros(n, m)), shape=(n, m))
    assert comp.width(n, m) == 64
    low = comp.tensor_plan((n, m), 16)
    p = Payload.allocate(low, torch.float32)
    comp.compress(x, low, p, ctx, update_state=False)
    assert widths == [16]
    basis = orthogonalize(seeded_factor(0, "w:q", m, 64, dtype=torch.float64)[:, :16])
    want = (x.double().view(n, m) @ basis).t().reshape(-1)
    torch.testing.assert_close(p.words.double(), want, rtol=1e-5, atol=1e-5)
    comp.compress(x, low, Payload.allocate(low, torch.float32), ctx, update_state=False)
    assert widths == [16]                                      # cached
    comp.compress(x, comp.tensor_plan((n, m), 64), Payload.allocate(comp.tensor_plan((n, m), 64), torch.float32),
                  ctx, update_state=False)
    assert widths == [16, 64]
