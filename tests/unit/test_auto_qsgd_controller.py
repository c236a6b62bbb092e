"""``mode: "auto"`` over QSGD in one process: the per-level variance of a bucket partition (the synchronizer's
vectorized form against the error model's, whole and on sampled blocks), the controller's ladder, budget and plan
from injected variance signals (a slow link sends fewer bits than a fast one; the quiet budget is the larger of
8-bit's variance and the efficiency floor's ``S·(1/E − 1)``), and the codes as levels: b bits ↔ CF 32/b, dense
↔ a level a quantized bucket sends dense."""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.adapt.auto.controller import PLAIN, QSGD_CFS, AutoController
from ds_gravac.adapt.auto.error_model import qsgd_variance
from ds_gravac.adapt.auto.ladder import QSGD
from ds_gravac.adapt.auto.timing import Pricer, link_fits
from ds_gravac.adapt.base import ControllerContext
from ds_gravac.config import parse_config
from ds_gravac.sync.cost_model.fits import FitTable
from ds_gravac.sync.quant_variance import VarianceSample, VarianceSignal, VarianceSpec, block_variance
from ds_gravac.telemetry.stats import AgreedStats

S = torch.tensor([127.0, 7.0, 1.0], dtype=torch.float64)


@pytest.mark.parametrize("numel", [1, 127, 128, 1000, 40000])
def test_block_variance_is_the_error_models_variance_at_every_level(numel: int) -> None:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)) * 3.0
    got = block_variance(x, S, 128, None)
    want = [qsgd_variance(x, int(s), 128) for s in S]
    assert got.tolist() == pytest.approx(want, rel=1e-10, abs=1e-12)     # 1 value: p is 0 up to rounding
    blocks = -(-numel // 128)
    rows = torch.randperm(blocks, generator=torch.Generator().manual_seed(1))[:max(1, blocks // 3)]
    sampled = block_variance(x, S, 128, rows)
    assert sampled.tolist() == pytest.approx([qsgd_variance(x, int(s), 128, blocks=rows) for s in S], rel=1e-10)


def test_sampled_blocks_estimate_the_whole_without_bias() -> None:
    """The mean over many uniform block samples approaches the exact value (the scale-up is unbiased)."""
    x = torch.randn(128 * 400, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 5.0, 128 * 400)
    exact = block_variance(x, S, 128, None)
    gen = torch.Generator().manual_seed(2)
    mean = sum(block_variance(x, S, 128, torch.randperm(400, generator=gen)[:64]) for _ in range(400)) / 400
    assert torch.allclose(mean, exact, rtol=0.03)


SHAPES = [("stem.weight", (64, 3, 7, 7)), *[(f"a{i}.weight", (256, 2304)) for i in range(4)],
          *[(f"b{i}.weight", (512, 4608)) for i in range(3)], ("fc.weight", (100, 2048)), ("fc.bias", (100,))]


def _signals(ctl: AutoController, energy: float = 1.0) -> tuple[VarianceSignal, ...]:
    """Per group: energy ∝ size, 8-bit variance 1e-4 of it, ×330 per halving of the bits (QSGD's s² ratios)."""
    out = []
    for g in ctl.groups:
        e = energy * g.numel / 1e6
        v8 = 1e-4 * e
        out.append(VarianceSignal(energy=e, applied=e + v8, variance=(v8, v8 * (127 / 7) ** 2, v8 * 127 ** 2)))
    return tuple(out)


def _controller(rate_bit_s: float, **keys: object) -> AutoController:
    auto = {"interval_steps": 10, "dwell": 0, "remeasure_decisions": 0, **keys}
    ctl = AutoController(parse_config({"mode": "auto", "compressor": "qsgd", "auto": auto}))
    spec = ctl.signal_groups(SHAPES)
    assert isinstance(spec, VarianceSpec) and spec.bucketed and spec.cfs == QSGD_CFS == (4.0, 8.0, 16.0)
    assert spec.s == (127, 7, 1) and spec.block == 128
    fits = FitTable(link_fits(rate_bit_s, 1e-4, 2))
    ctl.bind(ControllerContext(world_size=2, samples_per_step=32, realize_cf=float, cf_grid=(4.0, 8.0, 16.0),
                               multilevel="none", gain_kind="unbiased", level_kind="cf",
                               compressible=tuple(n for n, _ in SHAPES), cost_fits=lambda: fits))
    for step in range(3):
        sample = VarianceSample(step=step, groups=_signals(ctl))
        ctl.observe(AgreedStats(step=step + 1, decision=None, den=0.0, den_raw=0.0, nums=(), t_iter_prev=0.0,
                                t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=0.0, world_size=2,
                                aggregate=sample))
    return ctl


def _plan(rate_bit_s: float, **keys: object) -> tuple[AutoController, list[int], float]:
    ctl = _controller(rate_bit_s, **keys)
    quiet = ctl.tight_until
    ctl.accept(quiet, ctl.propose(quiet, 0.1))
    return ctl, ctl.codes, Pricer(FitTable(link_fits(rate_bit_s, 1e-4, 2)), 2).payload(ctl.groups, ctl.codes)


def test_the_ladders_are_dense_and_qsgd_bits() -> None:
    ctl = _controller(1e9)
    for g in ctl.groups:
        assert [str(lv) for lv in g.ladder] == (["dense", "qsgd:8b"] if g.pinned
                                                else ["dense", "qsgd:8b", "qsgd:4b", "qsgd:2b"]), g.name
    assert [g.ladder[c] for g, c in zip(ctl.groups, ctl.reference)] == [lv for g in ctl.groups
                                                                       for lv in g.ladder if lv.value == 8.0]


def test_a_slow_link_sends_fewer_bits_than_a_fast_one_within_the_budget() -> None:
    slow, slow_codes, slow_bytes = _plan(1e8, efficiency_floor=0.9)
    fast, fast_codes, fast_bytes = _plan(1e11, efficiency_floor=0.9)
    assert slow_bytes < fast_bytes and any(0 < slow.groups[g].ladder[c].value < 8 for g, c in enumerate(slow_codes))
    for ctl in (slow, fast):
        assert not ctl.tight and ctl.last["error"] <= ctl.last["budget"]
        assert ctl.last["time"] <= ctl.last["ref_time"]
        assert all(math.isfinite(v) for v in ctl.last.values())


def test_the_quiet_budget_is_the_larger_of_the_reference_and_the_efficiency_floor() -> None:
    signal = sum(s.energy for s in _signals(_controller(1e9)))
    for floor in (0.5, 0.9, 0.99, 1.0):
        ctl, _, _ = _plan(1e8, efficiency_floor=floor)
        want = max(ctl.last["ref_error"], signal * (1.0 / floor - 1.0))
        assert ctl.last["budget"] == pytest.approx(want, rel=1e-12), floor
    tight = _controller(1e8)
    proposal = tight.propose(2, 0.1)
    tight.accept(2, proposal)
    assert tight.tight and tight.last["budget"] == pytest.approx(0.25 * tight.last["ref_error"], rel=1e-12)


def test_codes_become_cfs_and_dense_becomes_plain() -> None:
    ctl, codes, _ = _plan(1e8, efficiency_floor=0.9)
    decision = ctl.decide(ctl.tight_until, 0.1)
    for g, c in zip(ctl.groups, codes):
        level = g.ladder[c]
        want = 32.0 / level.value if level.family == QSGD else PLAIN
        assert all(decision.level_for(m) == want for m in g.members), g.name
    telemetry = ctl.telemetry()
    assert {telemetry[f"auto/level/{g.name}"] for g in ctl.groups} <= {0.0, 8.0, 4.0, 2.0}


# ---- QuantVariance on its own (one process: two identical "ranks'" rows, the math only) -----------------------
def _variance_rig(sizes: list[int]) -> tuple:
    """Real bucket-plan objects, one bucket per tensor, all in group 0; a plan namespace as the planner holds it."""
    from types import SimpleNamespace
    from ds_gravac.sync.buckets import Bucket, Member
    from ds_gravac.sync.quant_variance import QuantVariance
    members, buckets = [], []
    for i, n in enumerate(sizes):
        m = Member(index=i, name=f"w{i}", param=torch.zeros(n), compressible=True)
        b = Bucket(index=i, compressible=True, dtype=torch.float32)
        b.add(m)
        members.append(m)
        buckets.append(b)
    spec = VarianceSpec(members={m.name: 0 for m in members}, count=1, cfs=QSGD_CFS, s=(127, 7, 1), block=128)
    planner = SimpleNamespace(members=members, plan=SimpleNamespace(buckets=buckets))
    return QuantVariance(planner, spec, seed=0, world_size=2), buckets


def _one_step(qv, buckets, xs, actions, step) -> tuple:
    from ds_gravac.sync.step_plan import StepPlan
    qv.begin(step, StepPlan(step, None, (), tuple(actions)))
    for b, x in zip(buckets, xs):
        qv.stage(b.index, x)
        qv.bucket_done(b, x, True)
    qv.end_step(True)
    tail = qv.tail().tolist()
    return qv.agreed([tail, tail]).groups[0]          # two ranks with the same input: V = 2·v/N² = v/2


def test_a_short_last_partition_is_sampled_within_its_own_blocks() -> None:
    """17,921 values at N = 2: partitions of 8,961 and 8,960 values (71 and 70 blocks of 128, both sampled 64
    blocks); the mean estimate over many steps approaches the error model's exact variance."""
    from ds_gravac.sync.step_plan import DENSE
    qv, buckets = _variance_rig([17921])
    x = torch.randn(17921, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.1, 3.0, 17921)
    exact = [sum(qsgd_variance(x[p * 8961:(p + 1) * 8961], s, 128) for p in range(2)) / 2 for s in (127, 7, 1)]
    mean = [0.0, 0.0, 0.0]
    for step in range(200):
        sig = _one_step(qv, buckets, [x], [DENSE], step)
        mean = [a + v / 200 for a, v in zip(mean, sig.variance)]
    assert mean == pytest.approx(exact, rel=0.03)


def test_the_signal_energy_subtracts_only_what_each_bucket_was_sent_with() -> None:
    """One group, two buckets: one sent at 4 bits, the other dense (a selector may refuse a small bucket): S is
    ‖Q̄‖² minus the 4-bit variance of the first bucket alone."""
    from ds_gravac.sync.step_plan import DENSE, compress
    qv, buckets = _variance_rig([4096, 2048])
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(4096, generator=gen), torch.randn(2048, generator=gen)]
    sig = _one_step(qv, buckets, xs, [compress((8.0,)), DENSE], 0)
    applied = sum(float(x.double().square().sum()) for x in xs)
    sent = sum(qsgd_variance(xs[0][p * 2048:(p + 1) * 2048], 7, 128) for p in range(2)) / 2
    assert sig.applied == pytest.approx(applied, rel=1e-12)
    assert sig.energy == pytest.approx(applied - sent, rel=1e-9)


def test_a_checkpoint_of_another_family_starts_afresh() -> None:
    """Same groups, other ladders: a PowerSGD auto state loaded under QSGD would index the wrong rungs."""
    lowrank = AutoController(parse_config({"mode": "auto", "compressor": "powersgd"}))
    lowrank.signal_groups(SHAPES)
    lowrank.codes = [len(g.ladder) - 1 for g in lowrank.groups]
    qsgd = _controller(1e8)
    before = qsgd.state_dict()
    qsgd.load_state_dict(lowrank.state_dict())
    assert qsgd.state_dict() == before and before["family"] == "qsgd"
    assert [e["event"] for e in qsgd.pop_events()][-1] == "auto_family_changed"
