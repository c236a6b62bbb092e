"""Re-projection before a raise (``mode: "auto"``): a group whose new code raises its rank travels plain for one
step at ``REPROJECT``, where PowerSGD's warm start takes one power iteration on the exact average (as on a dense
step) and every rank of it is measured; at ``PLAIN`` nothing moves. Then the new rank applies."""
from __future__ import annotations

import torch

from ds_gravac.adapt.auto.controller import PLAIN, REPROJECT
from ds_gravac.adapt.auto.ladder import LOWRANK
from ds_gravac.compress.base import CompressCtx, Payload
from ds_gravac.config import parse_config
from ds_gravac.integration.engine import build_compressor
from auto_cases import _controller

N, M = 64, 96


def _commit_plain(level: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object]:
    """One plain commit of a 64×96 matrix at ``level`` on one rank; the factor before and after, G, energies."""
    comp = build_compressor(parse_config({"mode": "auto", "compressor": "powersgd"}))
    comp.wants_energies = True
    ctx = CompressCtx(key="w", shape=(N, M))
    width = comp.width(N, M)
    before = comp.basis(ctx, "q", M, width).clone()          # the warm start's orthonormal rows (width × m)
    g = torch.randn(N, M, generator=torch.Generator().manual_seed(3))
    plan = comp.tensor_plan((N, M), level)
    assert plan.get("rank") == 0                               # plain either way: the same bytes
    out = Payload.allocate(plan)
    x = g.reshape(-1).clone()
    comp.compress(x, plan, out, ctx, update_state=True)
    comp.memory.commit_aggregate(x, g.reshape(-1).clone(), [out], ctx)
    assert not x.any()                                         # plain: no error kept
    return before, comp.factors["w"]["q"].clone(), g, comp.component_energies(ctx)


def test_reproject_moves_the_warm_start_by_one_power_iteration_on_the_exact_average() -> None:
    before, after, g, energies = _commit_plain(REPROJECT)
    g64, qh = g.double(), before.double()
    y = g64 @ qh.t()                                            # G·Qh: n × width
    ph, _ = torch.linalg.qr(y)                                  # float64 reference, independent of the compressor
    want = ph.t() @ g64                                         # (Gᵀ·Ph)ᵀ: width × m
    # the factor's row space and energy, not its signs (QR conventions may differ)
    proj = lambda rows: rows.t() @ torch.linalg.pinv(rows @ rows.t()) @ rows    # noqa: E731
    assert torch.allclose(proj(after.double()), proj(want), atol=1e-5)
    assert energies is not None
    assert abs(float(energies.sum()) - float(want.square().sum())) <= 1e-4 * float(want.square().sum())


def test_plain_leaves_the_warm_start_and_measures_nothing() -> None:
    before, after, _, energies = _commit_plain(PLAIN)
    comp = build_compressor(parse_config({"mode": "auto", "compressor": "powersgd"}))
    assert energies is None
    ctx = CompressCtx(key="w", shape=(N, M))
    assert torch.equal(comp.factor(ctx, "q", M, comp.width(N, M)), after)     # still the seeded draw


def _ranked(ctl) -> list[int]:
    return [i for i, (g, c) in enumerate(zip(ctl.groups, ctl.codes)) if g.ladder[c].family == LOWRANK]


def test_a_raised_group_is_reprojected_for_one_step_then_sent_at_its_new_rank() -> None:
    ctl = _controller(1e8)
    step = ctl.tight_until
    ctl.accept(step, ctl.propose(step, 0.1))
    assert ctl.reproject == []                 # after the all-dense tight start every warm start is current
    low = [i for i in _ranked(ctl) if ctl.codes[i] > 1]
    assert len(low) >= 2, ctl.codes
    up, down = low[0], low[1]
    codes = list(ctl.codes)
    codes[up] = 1                                                            # rank 64: a raise
    codes[down] = len(ctl.groups[down].ladder) - 1                           # its lowest rank: not a raise
    step += ctl.interval
    ctl.accept(step, torch.tensor(codes + [0], dtype=torch.int64))
    assert ctl.reproject == [up]
    first, then = ctl.decide(step, 0.1), ctl.decide(step + 1, 0.1)
    for m in ctl.groups[up].members:
        assert first.level_for(m) == REPROJECT and then.level_for(m) == float(ctl.groups[up].ladder[1].value)
    low_rank = float(ctl.groups[down].ladder[codes[down]].value)
    assert all(first.level_for(m) == then.level_for(m) == low_rank for m in ctl.groups[down].members)
    state = ctl.state_dict()                                                 # the pending step survives a resume
    twin = _controller(1e8)
    twin.load_state_dict(state)
    assert twin.decide(step, 0.1).level_for(ctl.groups[up].members[0]) == REPROJECT
