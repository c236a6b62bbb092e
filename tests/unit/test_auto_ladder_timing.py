"""Groups, ladders and time per level of the goodput controller (``ds_gravac/adapt/auto/ladder.py``,
``timing.py``), checked against the compressors' own rules and plans and the cost model's own formulas."""
from __future__ import annotations

import pytest

from ds_gravac.adapt.auto.ladder import (DENSE_LEVEL, LOWRANK, QSGD, SPARSE, Level, build_groups, classifier_name,
                                         uniform_codes)
from ds_gravac.adapt.auto.solver import solve, totals
from ds_gravac.adapt.auto.timing import Pricer, link_fits, predicted_step
from ds_gravac.compress.powersgd import PowerSGD
from ds_gravac.compress.qsgd import QSGD as QSGDCompressor
from ds_gravac.compress.topk import TopK
from ds_gravac.sync.cost_model.fits import ALL_GATHER, ALL_REDUCE, FitTable, LinearFit
from ds_gravac.sync.cost_model.predict import dense_time

# a small ResNet-like model: stem, repeated blocks, a vector group, the classifier
SHAPES = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,)),
          ("l1.0.conv.weight", (256, 64, 3, 3)), ("l1.0.bn.weight", (256,)),
          ("l1.1.conv.weight", (256, 64, 3, 3)), ("l2.0.conv.weight", (512, 256, 1, 1)),
          ("l2.0.bn.bias", (512,)), ("tiny.weight", (8, 8)), ("fc.weight", (10, 2048)), ("fc.bias", (10,))]


def groups():
    return build_groups(SHAPES)


def test_groups_are_shape_classes_with_the_classifier_alone() -> None:
    gs = groups()
    by = {g.name: g for g in gs}
    assert classifier_name(SHAPES) == "fc.weight"
    assert by["classifier"].members == ("fc.weight",) and by["classifier"].pinned
    assert by["256x576"].members == ("l1.0.conv.weight", "l1.1.conv.weight") and by["256x576"].count == 2
    assert set(by["vectors"].members) == {"bn1.weight", "bn1.bias", "l1.0.bn.weight", "l2.0.bn.bias", "fc.bias"}
    assert by["8x8"].pinned and not by["256x576"].pinned
    assert sum(g.numel for g in gs) == sum(__import__("math").prod(s) for _, s in SHAPES)
    assert [g.index for g in gs] == list(range(len(gs)))
    with pytest.raises(ValueError):
        build_groups(SHAPES, classifier="nope")
    assert "classifier" not in {g.name for g in build_groups(SHAPES, classifier=None)}


def test_ladders_start_dense_and_keep_only_ranks_the_compressor_would_compress() -> None:
    comp = PowerSGD()
    for g in groups():
        assert g.ladder[0] == DENSE_LEVEL
        n, m = g.shape
        ranks = [int(lv.value) for lv in g.ladder if lv.family == LOWRANK]
        if not g.matrix:
            assert ranks == []
            continue
        allowed = [r for r in (64, 32, 16, 8, 4, 2) if comp.pays(n, m, r) and r <= min(n, m)]
        if g.pinned:
            allowed = [r for r in allowed if r >= 16]
        assert ranks == allowed, g.name
    by = {g.name: g for g in groups()}
    assert [lv.value for lv in by["256x576"].ladder if lv.family == QSGD] == [8.0, 4.0, 2.0]
    assert [lv.value for lv in by["256x576"].ladder if lv.family == SPARSE] == [4.0, 10.0, 30.0, 100.0]
    # pinned: at or above the references (rank >= 16, 8 bits, CF <= 30)
    assert by["classifier"].ladder == (DENSE_LEVEL, Level(QSGD, 8.0), Level(SPARSE, 4.0), Level(SPARSE, 10.0),
                                       Level(SPARSE, 30.0))
    only_lr = build_groups(SHAPES, families=(LOWRANK,))
    assert all(lv.family in ("dense", LOWRANK) for g in only_lr for lv in g.ladder)


def test_uniform_codes_send_what_a_static_run_sends() -> None:
    gs = groups()
    codes = uniform_codes(gs, Level(LOWRANK, 16.0))
    for g, c in zip(gs, codes):
        lv = g.ladder[c]
        n, m = g.shape
        if g.matrix and PowerSGD().pays(n, m, 16) and not g.pinned:
            assert lv == Level(LOWRANK, 16.0)
        elif lv.family == LOWRANK:
            assert lv.value >= 16
        else:
            assert lv == DENSE_LEVEL                      # plain, as the compressor sends a matrix rank 16 misses


def test_payloads_equal_the_compressors_plans() -> None:
    n_ranks = 2
    pricer = Pricer(link_fits(1e9, 1e-3, n_ranks), n_ranks)
    comp = PowerSGD()
    comp.bind_levels("rank", 64)
    for g in groups():
        for lv in g.ladder:
            got = pricer.cost(g, lv).payload_bytes
            if lv.family == LOWRANK:
                words = sum(comp.sent_payload_words(comp.tensor_plan(g.shape, lv.value)) for _ in g.members)
                assert got == pytest.approx(4 * words * 2 * (n_ranks - 1) / n_ranks)
            elif lv.family == QSGD:
                plan = QSGDCompressor().make_plan(-(-g.numel // n_ranks), 32 / lv.value)
                assert got == pytest.approx(4 * plan.words * n_ranks * (n_ranks - 1))
            elif lv.family == SPARSE:
                words = sum(TopK().make_plan(s, lv.value).words for s in g.sizes)
                assert got == pytest.approx(4 * words * (n_ranks - 1))
            else:
                assert got == 4 * g.numel


def test_prices_follow_the_fits_and_the_link() -> None:
    gs = groups()
    fast, slow = Pricer(link_fits(1e9, 1e-3, 2), 2), Pricer(link_fits(1e8, 1e-3, 2), 2)
    for g in gs:
        d = fast.cost(g, DENSE_LEVEL)
        table = FitTable({**fast.link})
        assert d.exposed(0.0) == pytest.approx(dense_time(table, g.numel, 4))
        assert slow.cost(g, DENSE_LEVEL).wire_s > d.wire_s
        for lv in g.ladder[1:]:
            c = fast.cost(g, lv)
            assert c.codec_s > 0 and c.wire_s > 0
            assert slow.cost(g, lv).wire_s > c.wire_s
            assert slow.cost(g, lv).codec_s == pytest.approx(c.codec_s, rel=1e-9)
    # a measured table overrides the link prior; codec keys of the table never leak into another family
    measured = FitTable({ALL_REDUCE: LinearFit(0.5, 0.0), ALL_GATHER: LinearFit(0.5, 0.0),
                         "encode@4": LinearFit(0.0, 1.0)})
    p = Pricer(measured, 2)
    g = gs[3]
    assert p.cost(g, DENSE_LEVEL).wire_s == pytest.approx(0.5)
    assert p.cost(g, Level(SPARSE, 4.0)).codec_s < 1e-3 * g.numel
    with pytest.raises(ValueError):
        Pricer(measured, 2, overlap=1.0)
    hidden = Pricer(link_fits(1e8, 1e-3, 2), 2, overlap=0.5)
    assert hidden.cost(g, DENSE_LEVEL).exposed(0.5) < slow.cost(g, DENSE_LEVEL).exposed(0.0)


def test_shared_buckets_price_a_groups_bytes_and_a_dense_rung_as_plain_fp32() -> None:
    """``auto.buckets: "shared"``: a group's collectives are the bucket's, so its rank rungs cost the link's slope
    times their two rounds' bytes (no latency), its dense rung the slope times 4 bytes a value (plain fp32 in the
    first round); a dense step is one all-reduce of every value in the dense dtype. Prices derived here from the
    fits' coefficients."""
    a, b = 2e-3, 8e-9
    fits = {ALL_REDUCE: LinearFit(a, b), ALL_GATHER: LinearFit(a, b)}
    own, shared = Pricer(fits, 2, dense_bytes=2), Pricer(fits, 2, dense_bytes=2, shared=True)
    assert own.key != shared.key
    gs = build_groups(SHAPES, families=(LOWRANK,))
    for g in gs:
        n, m = g.shape
        dense = shared.cost(g, DENSE_LEVEL)
        assert (dense.payload_bytes, dense.codec_s) == (4.0 * g.numel, 0.0)
        assert dense.wire_s == pytest.approx(b * 4.0 * g.numel, rel=1e-12)
        assert own.cost(g, DENSE_LEVEL).wire_s == pytest.approx(a + b * 2.0 * g.numel, rel=1e-12)
        for lv in g.ladder[1:]:
            r = int(lv.value)
            words = g.count * (n + m) * r
            assert shared.cost(g, lv).wire_s == pytest.approx(b * 4.0 * words, rel=1e-12), (g.name, r)
            assert own.cost(g, lv).wire_s == pytest.approx(2 * a + b * 4.0 * words, rel=1e-12), (g.name, r)
            assert shared.cost(g, lv).codec_s == own.cost(g, lv).codec_s
    total = sum(g.numel for g in gs)
    table = FitTable({**shared.link})
    assert shared.dense_step(gs) == pytest.approx(dense_time(table, total, 2), rel=1e-12)
    assert shared.dense_step(gs) < sum(shared.cost(g, DENSE_LEVEL).exposed(0.0) for g in gs)
    # a plan's time: the sum of its rungs, except an all-dense plan in shared buckets, which is one dense step
    dense, mixed = [0] * len(gs), [len(g.ladder) - 1 for g in gs]
    for pricer in (own, shared):
        times = pricer.times(gs)
        assert pricer.plan_time(gs, times, mixed) == pytest.approx(sum(t[c] for t, c in zip(times, mixed)), rel=1e-12)
    assert own.plan_time(gs, own.times(gs), dense) == pytest.approx(sum(t[0] for t in own.times(gs)), rel=1e-12)
    assert shared.plan_time(gs, shared.times(gs), dense) == shared.dense_step(gs)


def test_a_slower_link_plans_more_compression_at_the_same_budget() -> None:
    """The same ladders and errors: at 100 Mbit/s the plan sends fewer bytes than at 1 Gbit/s, and each plan is
    never predicted slower than the uniform reference at the reference's error."""
    gs = build_groups(SHAPES, families=(LOWRANK,))
    errors = [[0.0] + [1.0 / lv.value for lv in g.ladder[1:]] for g in gs]      # fewer components, more error
    ref = uniform_codes(gs, Level(LOWRANK, 16.0))
    sent = {}
    for rate in (1e9, 1e8):
        pricer = Pricer(link_fits(rate, 1e-3, 2), 2)
        times = pricer.times(gs)
        budget = totals(times, errors, ref)[1] * 4
        plan = solve(times, errors, budget, reference=ref)
        assert plan.time <= totals(times, errors, ref)[0]
        assert predicted_step(0.5, times, plan.codes) == pytest.approx(0.5 + plan.time)
        sent[rate] = pricer.payload(gs, plan.codes)
    assert sent[1e8] <= sent[1e9]


def test_m0_replay_on_a_tiny_model_never_predicts_the_plan_slower_than_uniform(tmp_path) -> None:
    """The offline replay end to end (real backward passes, error tables, prices, plans) on a tiny CNN: at every
    budget the plan is within it and never predicted slower than the best uniform level that fits it."""
    from ds_gravac_bench.auto_m0 import main
    out = main(["--model", "tiny_cnn", "--rates", "100mbit", "--batch", "4", "--out", str(tmp_path / "m0.json")])
    assert (tmp_path / "m0.json").exists()
    for view in out["rates"]["100mbit"].values():
        uniform = {u["level"]: u for u in view["uniform"]}
        for s in view["sweep"]:
            assert s["plan_error"] <= s["budget"]
            assert s["budget_of"] not in uniform or s["budget"] == uniform[s["budget_of"]]["error"]
            assert s["plan_step_s"] <= s["uniform_step_s"] + 1e-12 and s["saving"] >= -1e-12
    again = main(["--model", "tiny_cnn", "--rates", "100mbit", "--batch", "4",
                  "--signals-from", str(tmp_path / "m0.json")])
    def plans(result):
        return {name: [{k: v for k, v in s.items() if k != "solve_ms"} for s in view["sweep"]]
                for name, view in result["rates"]["100mbit"].items()}
    assert plans(again) == plans(out)
