"""``mode: "auto"`` over Top-k in one process: the per-tensor thresholds of the unsent-energy signal (exact on a
small tensor, the matching quantile of a sample on a large one), the ladder and reference, and the plan from
injected unsent energies (a slow link sends at higher CFs than a fast one, within the budget; codes as CFs)."""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.adapt.auto.controller import PLAIN, AutoController
from ds_gravac.adapt.auto.ladder import SPARSE, SPARSE_CFS
from ds_gravac.adapt.auto.timing import Pricer, link_fits
from ds_gravac.adapt.base import ControllerContext
from ds_gravac.compress.base import k_for
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError
from ds_gravac.sync.cost_model.fits import FitTable
from ds_gravac.sync.sparse_unsent import THRESHOLD_SAMPLE, UnsentSample, UnsentSignal, UnsentSpec, thresholds
from ds_gravac.telemetry.stats import AgreedStats


def test_thresholds_are_the_kth_largest_magnitude_of_a_small_tensor() -> None:
    x = torch.randn(3000, generator=torch.Generator().manual_seed(0))
    got = thresholds(x, SPARSE_CFS, torch.Generator().manual_seed(1)).tolist()
    for cf, tau in zip(SPARSE_CFS, got):
        k = k_for(cf, x.numel())
        assert tau == float(x.abs().double().topk(k).values[-1]), cf
        assert int((x.abs().double() >= tau).sum()) == k


def test_thresholds_of_a_large_tensor_are_close_quantiles() -> None:
    n = 40 * THRESHOLD_SAMPLE
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    got = thresholds(x, SPARSE_CFS, torch.Generator().manual_seed(1)).tolist()
    for cf, tau in zip(SPARSE_CFS, got):
        kept = int((x.abs() >= tau).sum())
        assert kept == pytest.approx(k_for(cf, n), rel=0.25), cf       # a 4,096-value sample's quantile


SHAPES = [("stem.weight", (64, 3, 7, 7)), *[(f"a{i}.weight", (256, 2304)) for i in range(4)],
          *[(f"b{i}.weight", (512, 4608)) for i in range(3)], ("fc.weight", (100, 2048))]


def _controller(rate_bit_s: float) -> AutoController:
    ctl = AutoController(parse_config({"mode": "auto", "compressor": "topk",
                                       "auto": {"interval_steps": 10, "dwell": 0, "remeasure_decisions": 0}}))
    spec = ctl.signal_groups(SHAPES)
    assert isinstance(spec, UnsentSpec) and spec.bucketed and spec.cfs == SPARSE_CFS
    fits = FitTable(link_fits(rate_bit_s, 1e-4, 2))
    ctl.bind(ControllerContext(world_size=2, samples_per_step=32, realize_cf=float, cf_grid=None,
                               multilevel="none", gain_kind="ef", level_kind="cf",
                               compressible=tuple(n for n, _ in SHAPES), cost_fits=lambda: fits))
    for step in range(3):       # unsent fraction 1 − CF^-0.3 of each group's energy (a heavy-tailed gradient)
        sigs = tuple(UnsentSignal(energy=float(g.numel), unsent=tuple(g.numel * (1 - cf ** -0.3) for cf in SPARSE_CFS))
                     for g in ctl.groups)
        ctl.observe(AgreedStats(step=step + 1, decision=None, den=0.0, den_raw=0.0, nums=(), t_iter_prev=0.0,
                                t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=0.0, world_size=2,
                                aggregate=UnsentSample(step=step, groups=sigs)))
    return ctl


def _plan(rate_bit_s: float) -> tuple[AutoController, float]:
    ctl = _controller(rate_bit_s)
    ctl.accept(ctl.tight_until, ctl.propose(ctl.tight_until, 0.1))
    return ctl, Pricer(FitTable(link_fits(rate_bit_s, 1e-4, 2)), 2).payload(ctl.groups, ctl.codes)


def test_ladders_reference_and_a_slow_link_sending_fewer_bytes() -> None:
    slow, slow_bytes = _plan(1e8)
    fast, fast_bytes = _plan(1e11)
    for g in slow.groups:
        assert g.ladder[0].family == "dense" and all(lv.family == SPARSE for lv in g.ladder[1:]), g.name
        if g.pinned:
            assert all(lv.value <= 30 for lv in g.ladder[1:]), g.name
    assert [g.ladder[c].value for g, c in zip(slow.groups, slow.reference)] == [30.0] * len(slow.groups)
    assert slow_bytes < fast_bytes
    for ctl in (slow, fast):
        assert ctl.last["error"] <= ctl.last["budget"] == ctl.last["ref_error"]
        assert ctl.last["time"] <= ctl.last["ref_time"] and all(math.isfinite(v) for v in ctl.last.values())
    decision = slow.decide(slow.tight_until, 0.1)
    for g, c in zip(slow.groups, slow.codes):
        want = g.ladder[c].value if g.ladder[c].family == SPARSE else PLAIN
        assert all(decision.level_for(m) == want for m in g.members), g.name


def test_auto_accepts_topk_and_measures_its_codec() -> None:
    from ds_gravac.integration.engine import build_compressor
    assert build_compressor(parse_config({"mode": "auto", "compressor": "topk"})).name == "topk"
    ctl = AutoController(parse_config({"mode": "auto", "compressor": "topk"}))
    assert ctl.codec_levels == SPARSE_CFS and ctl.link_ops == ("all_reduce", "all_gather")
    with pytest.raises(GravacConfigError, match=r"supports powersgd, qsgd, topk .* not 'dgc'"):
        build_compressor(parse_config({"mode": "auto", "compressor": "dgc"}))
