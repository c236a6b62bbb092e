"""Cost-model selection without communication: the fits, the prediction formulas and the plan rules.

Expected values are computed by hand from the formulas in the docs (docs/design.md, "Cost-model selection"), not
by calling the code under test a second way.
"""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.compress.base import CompressCtx
from ds_gravac.compress.onebit import OneBit
from ds_gravac.compress.powersgd import PowerSGD
from ds_gravac.compress.signsgd import SignSGD
from ds_gravac.compress.topk import TopK
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacUnsupportedError
from ds_gravac.sync.buckets import Bucket, Member
from ds_gravac.sync.codec import BucketCodec
from ds_gravac.sync.cost_model.calibrate import codec_sizes, initial_level
from ds_gravac.sync.cost_model.fits import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, FitTable,
                                            LinearFit, SampleWindow, least_squares)
from ds_gravac.sync.cost_model.predict import compressed_time, dense_time
from ds_gravac.sync.cost_model.selector import CostModelSelector, check_priceable, exchange_candidates
from ds_gravac.sync.exchange import PATTERNS
from ds_gravac.sync.reduce_rule import ReduceRule
from ds_gravac.sync.selection import ThresholdSelector

RULE = ReduceRule(average=True, postscale=True, predivide=1.0, comm_dtype=torch.float32, world_size=2.0)


# ---- fits ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a, b", [(5e-5, 2e-9), (0.0, 1e-8), (1e-3, 0.0), (3.0, 7.0)])
def test_least_squares_recovers_a_and_b_exactly(a: float, b: float) -> None:
    samples = [(1.0, x, a + b * x) for x in (1e3, 3e4, 5e5, 2e6)]
    fit = least_squares(samples)
    assert fit.a == pytest.approx(a, rel=1e-9, abs=1e-15) and fit.b == pytest.approx(b, rel=1e-9, abs=1e-18)


def test_samples_of_several_calls_recover_the_per_call_cost() -> None:
    """A bucket's encode is one call per member: t = calls·A + B·elements."""
    a, b = 4e-5, 3e-9
    samples = [(c, x, c * a + b * x) for c, x in ((1, 1e4), (3, 1e4), (8, 2e6), (2, 5e5))]
    fit = least_squares(samples)
    assert (fit.a, fit.b) == (pytest.approx(a, rel=1e-9), pytest.approx(b, rel=1e-9))


def test_fits_are_never_negative() -> None:
    """Noise can tilt the unconstrained line below zero; a negative cost would make a primitive look free."""
    falling = least_squares([(1.0, 1e3, 2e-3), (1.0, 1e6, 1e-3)])          # slope < 0: B clamps to 0
    assert falling.b == 0.0 and falling.a == pytest.approx(1.5e-3)
    steep = least_squares([(1.0, 1e3, 0.0), (1.0, 2e3, 1e-3), (1.0, 3e3, 2e-3)])   # intercept < 0: A clamps
    assert steep.a == 0.0 and steep.b > 0
    assert least_squares([]) == LinearFit(0.0, 0.0)


def test_a_single_size_gives_the_proportional_fit() -> None:
    fit = least_squares([(1.0, 1e4, 2e-3), (1.0, 1e4, 4e-3)])
    assert fit.a == 0.0 and fit.b == pytest.approx(3e-3 / 1e4)


def test_window_keeps_only_the_last_samples() -> None:
    w = SampleWindow(size=4)
    for x in (1e3, 2e3):                         # old regime: will leave the window
        w.add(x, 1.0)
    for x in (1e4, 2e4, 4e4, 8e4):               # new regime: t = 1e-4 + 1e-8·x
        w.add(x, 1e-4 + 1e-8 * x)
    assert len(w) == 4
    fit = w.fit()
    assert fit.a == pytest.approx(1e-4) and fit.b == pytest.approx(1e-8)
    assert w.span() == pytest.approx(8.0)
    assert SampleWindow().samples.maxlen == 256


def test_codec_fit_of_an_unfitted_level_is_the_nearest_fitted_one() -> None:
    t = FitTable({"encode@10": LinearFit(1, 0), "encode@100": LinearFit(2, 0), "decode@10": LinearFit(3, 0)})
    assert t.codec("encode", 10).a == 1 and t.codec("encode", 20).a == 1 and t.codec("encode", 50).a == 2
    assert t.codec("encode", 1000).a == 2 and t.codec("decode", 500).a == 3
    assert t.codec("decode@", 1).a == 0                                   # nothing fitted: free
    back = FitTable.from_flat(t.names(), t.flat())
    assert back == t and back.names() == sorted(t.names())


def test_codec_sizes_are_capped_by_the_largest_bucket() -> None:
    assert codec_sizes(10**8) == [2**14, 2**18, 2**21]
    assert codec_sizes(100_000) == [2**14, 100_000]
    assert codec_sizes(5000) == [312, 5000]
    assert codec_sizes(1) == [1]


def test_initial_level_follows_the_mode() -> None:
    assert initial_level(parse_config({"mode": "static", "cf": 50}), TopK()) == 50
    assert initial_level(parse_config({"mode": "gravac", "theta_min": 20}), TopK()) == 20
    assert initial_level(parse_config({"mode": "static"}), OneBit()) == 32


# ---- predictions ---------------------------------------------------------------------------------------------
FITS = FitTable({STAGE: LinearFit(1e-5, 1e-9), WRITEBACK: LinearFit(2e-5, 2e-9),
                 ALL_REDUCE: LinearFit(1e-4, 1e-8), ALL_GATHER: LinearFit(2e-4, 2e-8),
                 ALL_TO_ALL: LinearFit(3e-4, 3e-8),
                 "encode@10": LinearFit(5e-5, 4e-9), "decode@10": LinearFit(6e-5, 5e-9),
                 "encode@32": LinearFit(7e-5, 6e-9), "decode@32": LinearFit(8e-5, 7e-9)})


def _codec(comp, sizes: list[int]) -> BucketCodec:
    bucket = Bucket(index=0, compressible=True, dtype=torch.float32)
    for i, n in enumerate(sizes):
        bucket.add(Member(index=i, name=f"p{i}", param=torch.zeros(n), compressible=True))
    return BucketCodec(bucket, comp, [CompressCtx(key=m.name) for m in bucket.members])


def test_dense_time_by_hand() -> None:
    m = 1000
    expected = (1e-5 + 1e-9 * m) + (1e-4 + 1e-8 * 4 * m) + (2e-5 + 2e-9 * m)
    assert dense_time(FITS, m, 4) == pytest.approx(expected, rel=1e-12)
    expected_bf16 = (1e-5 + 1e-9 * m) + (1e-4 + 1e-8 * 2 * m) + (2e-5 + 2e-9 * m)
    assert dense_time(FITS, m, 2) == pytest.approx(expected_bf16, rel=1e-12)


def test_allgather_time_of_a_sparse_bucket_by_hand() -> None:
    """Two top-k members of 600 and 400 elements at θ = 10: k = 60 and 40, payload (idx, val) = 2k words."""
    plans = _codec(TopK(), [600, 400]).plans((10.0, 10.0))
    n, m = 2, 1000
    payload = 4 * (2 * 60 + 2 * 40)
    enc = (5e-5 + 4e-9 * 600) + (5e-5 + 4e-9 * 400)
    dec = (6e-5 + 5e-9 * 600) + (6e-5 + 5e-9 * 400)
    edges = (1e-5 + 1e-9 * m) + (2e-5 + 2e-9 * m)
    expected = edges + enc + (2e-4 + 2e-8 * payload) + n * dec
    assert compressed_time(FITS, "allgather", m, n, plans) == pytest.approx(expected, rel=1e-12)
    expected_sum = edges + enc + (1e-4 + 1e-8 * payload) + dec
    assert compressed_time(FITS, "allreduce", m, n, plans) == pytest.approx(expected_sum, rel=1e-12)


def test_parameter_server_time_of_a_quantized_bucket_by_hand() -> None:
    """onebit, m = 6400 elements, N = 4: partitions of L = 1600, each 1 scale word + 50 bit words."""
    comp, n, m, L = OneBit(), 4, 6400, 1600
    plans = [comp.plan(L, 32.0)] * n
    part_bytes = 4 * (1 + 50)
    enc1, dec1 = 7e-5 + 6e-9 * L, 8e-5 + 7e-9 * L
    edges = (1e-5 + 1e-9 * m) + (2e-5 + 2e-9 * m)
    # worker encode of N partitions, owner re-encode of one, owner merge of N rows, final decode of N rows
    cpu = n * enc1 + enc1 + 2 * n * dec1
    net = (3e-4 + 3e-8 * n * part_bytes) + (2e-4 + 2e-8 * part_bytes)
    assert compressed_time(FITS, "casync_ps", m, n, plans) == pytest.approx(edges + cpu + net, rel=1e-12)
    gather = edges + n * enc1 + (2e-4 + 2e-8 * n * part_bytes) + n * (n * dec1)
    assert compressed_time(FITS, "allgather", m, n, plans) == pytest.approx(gather, rel=1e-12)


# ---- plan rules ----------------------------------------------------------------------------------------------
def _fits(link_b: float, enc_b: float = 1e-9, level: float = 10.0) -> FitTable:
    """A machine with a link of ``link_b`` seconds per byte and an encoder of ``enc_b`` seconds per element."""
    return FitTable({STAGE: LinearFit(1e-6, 1e-10), WRITEBACK: LinearFit(1e-6, 1e-10),
                     ALL_REDUCE: LinearFit(5e-5, link_b), ALL_GATHER: LinearFit(5e-5, link_b),
                     ALL_TO_ALL: LinearFit(5e-5, link_b),
                     f"encode@{level:g}": LinearFit(3e-5, enc_b), f"decode@{level:g}": LinearFit(3e-5, enc_b / 4)})


def _selector(comp, margin: float = 0.9, world: int = 2, fits: FitTable | None = None, auto: str = "auto",
              max_chunks: int = 1) -> CostModelSelector:
    cfg = parse_config({"mode": "static", "quantized_exchange": auto})
    threshold = ThresholdSelector(cfg, PATTERNS[exchange_candidates(auto, comp)[0]], RULE, world)
    sel = CostModelSelector(margin, exchange_candidates(auto, comp), RULE, world, threshold, max_chunks)
    if fits is not None:
        sel.set_fits(fits)
    return sel


def test_tiny_bucket_is_planned_dense_and_a_huge_one_compressed_on_a_slow_link() -> None:
    slow = _fits(link_b=8e-9)                 # ~1 Gbit/s
    sel = _selector(TopK(), fits=slow)
    tiny = sel.choose(_codec(TopK(), [256]), (10.0,))
    huge = sel.choose(_codec(TopK(), [4_000_000]), (10.0,))
    assert tiny.dense and not huge.dense and huge.exchange == "allgather"
    assert tiny.pred_compressed_s > 0.9 * tiny.pred_dense_s
    assert huge.pred_compressed_s <= 0.9 * huge.pred_dense_s


def test_a_fast_link_keeps_everything_dense() -> None:
    fast = _fits(link_b=1e-13)
    sel = _selector(TopK(), fits=fast)
    assert sel.choose(_codec(TopK(), [4_000_000]), (10.0,)).dense


def test_expensive_encode_keeps_a_huge_bucket_dense() -> None:
    sel = _selector(TopK(), fits=_fits(link_b=8e-9, enc_b=1e-7))
    assert sel.choose(_codec(TopK(), [4_000_000]), (10.0,)).dense


def test_margin_is_respected() -> None:
    """Fits chosen so that compressed ≈ 0.95 × dense: dense at margin 0.9, compressed at margin 1."""
    m = 1_000_000
    codec = _codec(TopK(), [m])
    base = _selector(TopK(), fits=_fits(link_b=8e-9)).choose(codec, (10.0,))
    ratio = base.pred_compressed_s / base.pred_dense_s
    for margin, dense in ((ratio * 0.999, True), (min(1.0, ratio * 1.001), False)):
        assert _selector(TopK(), margin=margin, fits=_fits(link_b=8e-9)).choose(codec, (10.0,)).dense is dense
    assert 0 < ratio < 1


def test_without_fits_the_threshold_rules_apply() -> None:
    """No fits yet: sparse_fallback decides (at N = 2 all-gather pays for θ > 2)."""
    sel = _selector(TopK())
    codec = _codec(TopK(), [10_000])
    assert sel.choose(codec, (1.5,)).dense and not sel.choose(codec, (10.0,)).dense
    assert sel.choose(codec, (10.0,)) == ThresholdSelector(parse_config({}), PATTERNS["allgather"], RULE,
                                                          2).choose(codec, (10.0,))
    assert math.isnan(sel.choose(codec, (10.0,)).pred_dense_s) and sel.version == 0


def test_auto_gathers_at_two_ranks_when_the_owner_would_only_reround() -> None:
    """Under the threshold rules ``"auto"`` keeps the parameter server, except with two ranks for quantizers whose
    owners average and keep no server residual (the same bytes per rank, one round and one rounding fewer);
    voting owners, server residuals and an explicit ``"ps"`` keep it."""
    from ds_gravac.compress.qsgd import QSGD, QSGDParams
    from ds_gravac.compress.terngrad import TernGrad
    from ds_gravac.sync.exchange import exchange_name
    assert exchange_name(QSGD(), "auto", 2) == "allgather" and exchange_name(TernGrad(), "auto", 2) == "allgather"
    for world in (0, 1, 3, 4):
        assert exchange_name(QSGD(), "auto", world) == "casync_ps", world
    assert exchange_name(QSGD(), "ps", 2) == "casync_ps"
    assert exchange_name(QSGD(QSGDParams(error_feedback=True)), "auto", 2) == "casync_ps"    # a server residual
    assert exchange_name(OneBit(), "auto", 2) == "casync_ps" and exchange_name(SignSGD(), "auto", 2) == "casync_ps"
    assert exchange_name(TopK(), "auto", 2) == "allgather" and exchange_name(OneBit(), "allgather", 3) == "allgather"


def test_quantizers_with_auto_choose_their_exchange() -> None:
    comp = OneBit()
    assert exchange_candidates("auto", comp) == ("casync_ps", "allgather")
    assert exchange_candidates("ps", comp) == ("casync_ps",)
    assert exchange_candidates("allgather", comp) == ("allgather",)
    assert exchange_candidates("auto", SignSGD()) == ("casync_ps",)      # the owners vote: no all-gather twin
    fits = _fits(link_b=8e-9, level=32.0)
    plans_numel, world = 4_000_000, 4
    bucket_codec = _codec(comp, [plans_numel])

    class Partitions:                 # the planner prices a quantized bucket by its N partition plans
        bucket = bucket_codec.bucket

        @staticmethod
        def plans(levels):
            return [comp.plan(-(-plans_numel // world), levels[0])] * world

    assert _selector(comp, world=world, fits=fits).choose(Partitions, (32.0,)).exchange == "casync_ps"
    slow_a2a = FitTable({**fits.fits, ALL_TO_ALL: LinearFit(5e-5, 1e-6)})
    assert _selector(comp, world=world, fits=slow_a2a).choose(Partitions, (32.0,)).exchange == "allgather"


def test_shape_priced_compressors_are_refused() -> None:
    with pytest.raises(GravacUnsupportedError, match=r"selection 'cost_model' .* 'powersgd'.*\"selection\""):
        check_priceable(PowerSGD(), exchange_candidates("auto", PowerSGD()))
    check_priceable(TopK(), ("allgather",))
    check_priceable(OneBit(), ("casync_ps", "allgather"))


# ---- calibration of every priceable compressor -----------------------------------------------------------------
def test_every_priceable_compressor_calibrates_on_a_private_copy() -> None:
    """Encode/decode/stage/write-back timings for every registered compressor the model prices; the real
    compressor's plan cache and state stay untouched (calibration runs on a copy)."""
    from ds_gravac.compress.registry import lookup, registered_names
    from ds_gravac.sync.cost_model.calibrate import codec_samples
    from ds_gravac.sync.cost_model.fits import decode_key, encode_key

    priced = 0
    for name in registered_names():
        comp = lookup(name)()
        candidates = exchange_candidates("auto", comp)
        try:
            check_priceable(comp, candidates)
        except GravacUnsupportedError:
            assert name in ("powersgd", "acpsgd"), name
            continue
        level = initial_level(parse_config({"mode": "static"}), comp)
        before = (dict(comp._plans), repr(comp.state_dict()))
        samples = codec_samples(comp, level, [64, 4096], 1, seed=0, world_size=2, rank=0)
        assert set(samples) == {encode_key(level), decode_key(level), STAGE, WRITEBACK}, name
        assert all(len(v) == 2 and all(t >= 0 and c == 1.0 for c, _, t in v) for v in samples.values()), name
        assert (dict(comp._plans), repr(comp.state_dict())) == before, name
        priced += 1
    assert priced >= 14


# ---- chunked pipelining ----------------------------------------------------------------------------------------
def test_chunks_are_contiguous_member_groups_near_equal_size() -> None:
    from ds_gravac.sync.exchange import chunk_spans
    assert chunk_spans([100] * 4, 2) == [(0, 2), (2, 4)]
    assert chunk_spans([100] * 4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert chunk_spans([1280, 16384, 16384, 16384], 2) == [(0, 2), (2, 4)]     # cut nearest 25216: 17664
    assert chunk_spans([10, 1000, 10], 3) == [(0, 1), (1, 2), (2, 3)]         # every chunk keeps a member
    assert chunk_spans([5000, 10, 10, 10], 2) == [(0, 1), (1, 4)]
    assert chunk_spans([7], 1) == [(0, 1)]


def test_chunk_counts_follow_the_plan_rule() -> None:
    """K ∈ {1, 2, 4, …, max_chunks}, m/K ≥ 4096, at most one chunk per member."""
    from ds_gravac.sync.exchange import chunk_counts
    assert chunk_counts(65536, 8, 8) == [1, 2, 4, 8]
    assert chunk_counts(65536, 8, 6) == [1, 2, 4]
    assert chunk_counts(65536, 3, 8) == [1, 2]
    assert chunk_counts(16384, 8, 8) == [1, 2, 4] and chunk_counts(16383, 8, 8) == [1, 2]
    assert chunk_counts(8191, 8, 8) == [1] and chunk_counts(10**6, 8, 1) == [1]


def _pipelined(e: list[float], c: list[float]) -> float:
    """By hand, equal chunks: e_1 + c_1 + (K−1)·max(e, c)."""
    return e[0] + c[0] + (len(e) - 1) * max(e[0], c[0])


def test_chunked_allgather_time_by_hand() -> None:
    """Four top-k members of 8192 at θ = 10 (k = 820, payload 2k words each), N = 2, in K = 1, 2, 4 chunks:
    stage + pipeline(encode_j, all_gather_j) + N·Σ decode + write-back."""
    sizes, n, m = [8192] * 4, 2, 32768
    plans = _codec(TopK(), sizes).plans((10.0,) * 4)
    edges = (1e-5 + 1e-9 * m) + (2e-5 + 2e-9 * m)
    dec = 4 * (6e-5 + 5e-9 * 8192)
    for k, spans in ((1, [(0, 4)]), (2, [(0, 2), (2, 4)]), (4, [(0, 1), (1, 2), (2, 3), (3, 4)])):
        per = 4 // k
        enc_j = per * (5e-5 + 4e-9 * 8192)
        net_j = 2e-4 + 2e-8 * 4 * per * 2 * 820
        expected = edges + _pipelined([enc_j] * k, [net_j] * k) + n * dec
        assert compressed_time(FITS, "allgather", m, n, plans, spans) == pytest.approx(expected, rel=1e-12), k
    assert (compressed_time(FITS, "allgather", m, n, plans, [(0, 4)]) ==
        pytest.approx(compressed_time(FITS, "allgather", m, n, plans), rel=1e-12))


def test_pipeline_of_unequal_chunks() -> None:
    from ds_gravac.sync.cost_model.predict import pipeline_time
    assert pipeline_time([1.0, 1.0], [3.0, 3.0]) == 7.0          # the link is the bottleneck: e_1 + 2c
    assert pipeline_time([3.0, 3.0], [1.0, 1.0]) == 7.0          # the CPU is: 2e + c_K
    assert pipeline_time([1.0, 5.0], [4.0, 1.0]) == 7.0          # chunk 2's encode outlasts chunk 1's send
    assert pipeline_time([2.0], [3.0]) == 5.0


def _chunk_fits(link_a: float) -> FitTable:
    """Encode and link of the same cost per element of Top-k θ = 10 (the all-gather moves 0.8 bytes per
    element), and a fixed cost ``link_a`` per collective."""
    return FitTable({STAGE: LinearFit(1e-6, 1e-10), WRITEBACK: LinearFit(1e-6, 1e-10),
                     ALL_REDUCE: LinearFit(1e-4, 8e-9), ALL_GATHER: LinearFit(link_a, 1e-8),
                     "encode@10": LinearFit(1e-6, 8e-9), "decode@10": LinearFit(1e-6, 1e-10)})


@pytest.mark.parametrize("link_a", [0.0, 1e-5, 1e-4, 3e-4, 1e-3])
def test_planner_takes_the_chunk_count_the_formula_favours(link_a: float) -> None:
    """Eight members of 16384 (m = 131072), max_chunks 8: every K ∈ {1, 2, 4, 8} is allowed; the chosen K is the
    argmin of the hand-computed T(K) (ties: fewer chunks); more fixed cost per collective, fewer chunks."""
    sizes, m, n = [16384] * 8, 131072, 2
    codec = _codec(TopK(), sizes)
    words = 2 * 1639                                      # k = ceil(16384 / 10)
    expected_t = {}
    for k in (1, 2, 4, 8):
        per = 8 // k
        enc_j = per * (1e-6 + 8e-9 * 16384)
        net_j = link_a + 1e-8 * 4 * per * words
        expected_t[k] = (2 * (1e-6 + 1e-10 * m) + _pipelined([enc_j] * k, [net_j] * k)
            + n * 8 * (1e-6 + 1e-10 * 16384))
    best = min(expected_t, key=lambda k: (expected_t[k], k))
    choice = _selector(TopK(), fits=_chunk_fits(link_a), max_chunks=8).choose(codec, (10.0,) * 8)
    assert not choice.dense and choice.chunks == best
    assert choice.pred_compressed_s == pytest.approx(expected_t[best], rel=1e-12)
    assert best == {0.0: 8, 1e-5: 8, 1e-4: 4, 3e-4: 2, 1e-3: 1}[link_a]        # the sweep covers every K


def test_one_chunk_when_max_chunks_is_1_or_chunks_would_be_small() -> None:
    fits = _chunk_fits(0.0)
    assert _selector(TopK(), fits=fits, max_chunks=1).choose(_codec(TopK(), [16384] * 8), (10.0,) * 8).chunks == 1
    small = _selector(TopK(), fits=fits, max_chunks=8).choose(_codec(TopK(), [2048] * 8), (10.0,) * 8)
    assert small.chunks == 4                                        # 16384 / 4 = 4096; 8 chunks would be 2048
    tiny = _selector(TopK(), fits=fits, max_chunks=8).choose(_codec(TopK(), [1000] * 8), (10.0,) * 8)
    assert tiny.chunks == 1                                         # 8000 elements: even 2 chunks are too small
    one = _selector(TopK(), fits=fits, max_chunks=8).choose(_codec(TopK(), [131072]), (10.0,))
    assert one.chunks == 1                                          # tensors are never split


def test_chunk_limit_keeps_quantizers_and_strict_decisions_at_one_chunk() -> None:
    from ds_gravac.sync.cost_model.selector import chunk_limit
    cfg = parse_config({"selection": "cost_model", "cost_model": {"max_chunks": 4}})
    assert chunk_limit(cfg, TopK()) == 4 and chunk_limit(cfg, OneBit()) == 1
    strict = parse_config({"selection": "cost_model", "decision": "strict", "cost_model": {"max_chunks": 4}})
    assert chunk_limit(strict, TopK()) == 1
    assert chunk_limit(parse_config({"selection": "cost_model"}), TopK()) == 1


def test_chunks_are_part_of_the_plan_digest() -> None:
    from ds_gravac.sync.step_plan import StepPlan, compress
    decision = type("D", (), {"branch": "compressed"})()
    plans = [StepPlan(1, decision, (), (compress((10.0,), "", None, k),)) for k in (1, 2)]
    assert plans[0].digest() != plans[1].digest()
    assert plans[0].actions[0] == compress((10.0,))
