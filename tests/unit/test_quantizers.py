"""Quantizer codecs (fp16, bf16, onebit, signsgd, efsignsgd, terngrad, ternary, qsgd, tbq): layouts, invariants of
each scheme against float64 references written here, determinism, edge inputs, and error-feedback conservation
through a simulated parameter-server exchange (partition, worker encode, owner merge + re-encode, all decode)."""
from __future__ import annotations

import math
import types
import warnings
from typing import Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ds_gravac.compress import bitpack
from ds_gravac.compress.base import CompressCtx, Kind, Payload, check_contract
from ds_gravac.compress.bf16 import BF16
from ds_gravac.compress.efsignsgd import EFSignSGD
from ds_gravac.compress.fp16 import FP16
from ds_gravac.compress.onebit import OneBit
from ds_gravac.compress.qsgd import QSGD
from ds_gravac.compress.signsgd import SignSGD
from ds_gravac.compress.tbq import TBQ
from ds_gravac.compress.ternary import Ternary
from ds_gravac.compress.terngrad import TernGrad

CLASSES = {c.name: c for c in (FP16, BF16, OneBit, SignSGD, EFSignSGD, TernGrad, Ternary, QSGD, TBQ)}
# (type, params) variants that change the codec; every grid level of each is exercised where it matters
VARIANTS = [("fp16", {}), ("bf16", {}), ("onebit", {}), ("onebit", {"scale": "two_means"}), ("signsgd", {}),
            ("efsignsgd", {}), ("terngrad", {}), ("terngrad", {"stochastic": False}), ("ternary", {}),
            ("ternary", {"clip_sigma": 0.0}), ("qsgd", {}), ("qsgd", {"bucket_size": 10}), ("tbq", {})]
STOCHASTIC = [("terngrad", {}), ("ternary", {}), ("qsgd", {})]
IDS = [f"{n}{'-' + '-'.join(f'{k}={v}' for k, v in p.items()) if p else ''}" for n, p in VARIANTS]


# ---- helpers --------------------------------------------------------------------------------------------
def make(name: str, **params):
    cls = CLASSES[name]
    return cls(cls.Params(**params))


def levels(comp) -> list[float]:
    return comp.cf_grid()


def laplace(n: int, seed: int = 0, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs()) * scale).to(dtype)


def ctx_for(comp, n: int, step: int = 1, rank: int = 0, world_size: int = 1, lr: float = 0.1, key: str = "b0.p0",
            residual: Optional[torch.Tensor] = None, dtype: torch.dtype = torch.float32) -> CompressCtx:
    ctx = CompressCtx(key=key, step=step, rank=rank, world_size=world_size, seed=1234, lr=lr, residual=residual)
    if comp.owns_state:
        ctx.memory = {comp.Memory.input_slot: torch.zeros(n, dtype=dtype)}
    return ctx


def alloc(comp, n: int, level: float, fill: int = 0) -> Payload:
    plan = comp.plan(n, level)
    return Payload(plan, torch.full((plan.words,), fill, dtype=torch.int32))


def encode(comp, x: torch.Tensor, level: float, ctx: CompressCtx, fill: int = 0) -> Payload:
    p = alloc(comp, x.numel(), level, fill)
    comp.compress(x, p.plan, p, ctx, update_state=False)
    return p


def decode(comp, p: Payload, ctx: CompressCtx, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = torch.full((p.plan.numel,), 7.0, dtype=dtype)   # garbage: accumulate=False must overwrite
    comp.decompress(p, out, accumulate=False, scale=1.0, ctx=ctx)
    return out


def expected_words(name: str, params: dict, n: int, theta: float) -> int:
    """Word counts written from the wire-format description, independently of the implementation."""
    w32 = lambda bits: math.ceil(n * bits / 32)   # noqa: E731
    if name in ("fp16", "bf16"):
        return math.ceil(n / 2)
    if name == "onebit":
        return w32(1) + (2 if params.get("scale") == "two_means" else 1)
    if name == "signsgd":
        return w32(1)
    if name == "efsignsgd":
        return w32(1) + 1
    if name == "terngrad":
        return w32(int(32 / theta)) + 2
    if name == "ternary":
        return w32(2) + 1
    if name == "qsgd":
        width = {16.0: 2, 8.0: 4, 4.0: 8}[theta]
        return w32(width) + math.ceil(n / params.get("bucket_size", 128))
    assert name == "tbq"
    return w32(2)


# ---- contract and parameters ------------------------------------------------------------------------------
EXPECTED_ATTRS = {   # kind, gain_kind, owns_state, grid
    "fp16": (Kind.SUMMABLE, "none", False, [2.0]), "bf16": (Kind.SUMMABLE, "none", False, [2.0]),
    "onebit": (Kind.QUANTIZED, "none", False, [32.0]), "signsgd": (Kind.QUANTIZED, "none", False, [32.0]),
    "efsignsgd": (Kind.QUANTIZED, "none", True, [32.0]),
    "terngrad": (Kind.QUANTIZED, "unbiased", False, [4.0, 8.0, 16.0, 32.0]),
    "ternary": (Kind.QUANTIZED, "unbiased", False, [16.0]),
    "qsgd": (Kind.QUANTIZED, "unbiased", False, [4.0, 8.0, 16.0]), "tbq": (Kind.QUANTIZED, "projection", True, [16.0]),
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_contract_and_class_attributes(name: str) -> None:
    cls = CLASSES[name]
    check_contract(cls)
    kind, gain, owns, grid = EXPECTED_ATTRS[name]
    comp = cls()
    assert (cls.kind, cls.gain_kind, cls.owns_state, comp.cf_grid()) == (kind, gain, owns, grid)
    assert cls.multilevel == "none" and cls.level_kind == "cf" and cls.rounds == 1
    assert cls.server_reencode == (kind == Kind.QUANTIZED)
    assert comp.realize_cf(1.0) == grid[0] and comp.realize_cf(1e6) == grid[-1]
    for theta in grid:
        assert comp.realize_cf(theta) == theta and comp.plan(100, theta).level == theta
    with pytest.raises(NotImplementedError):
        comp.compress_from(None, torch.zeros(1), None, None, None)


def test_grid_snapping_and_default_levels() -> None:
    assert make("terngrad").realize_cf(10.0) == 16.0 and make("qsgd").realize_cf(5.0) == 8.0
    assert [make("terngrad", bits=b).default_cf() for b in (1, 2, 4, 8)] == [32.0, 16.0, 8.0, 4.0]
    assert [make("qsgd", levels=s).default_cf() for s in (1, 7, 127)] == [16.0, 8.0, 4.0]
    assert make("terngrad").plan(10, 8.0).get("bits") == 4
    assert make("qsgd").plan(10, 16.0).get("levels") == 1 and make("qsgd").plan(10, 8.0).get("width") == 4
    assert make("onebit").default_cf() == 32.0 and make("fp16").default_cf() == 2.0


@pytest.mark.parametrize("name,bad", [("terngrad", {"bits": 3}), ("terngrad", {"bits": "2"}),
                                      ("onebit", {"scale": "max"}), ("onebit", {"error_feedback": "yes"}),
                                      ("qsgd", {"levels": 8}), ("qsgd", {"bucket_size": 0}),
                                      ("tbq", {"tau": 0.0}), ("tbq", {"tau": float("inf")}),
                                      ("ternary", {"clip_sigma": -1.0}), ("signsgd", {"scale": "mean_abs"}),
                                      ("efsignsgd", {"error_feedback": False}), ("fp16", {"bits": 16})])
def test_params_are_strict(name: str, bad: dict) -> None:
    with pytest.raises(ValidationError):
        CLASSES[name].Params(**bad)


def test_error_feedback_defaults() -> None:
    assert make("onebit").worker_error_feedback and make("onebit").server_error_feedback
    assert not make("onebit", error_feedback=False).server_error_feedback
    assert not make("signsgd").worker_error_feedback and not make("signsgd").server_error_feedback
    for name in ("terngrad", "ternary", "qsgd", "fp16", "bf16"):
        assert not make(name).worker_error_feedback
        assert make(name, error_feedback=True).worker_error_feedback
    assert make("tbq").server_error_feedback and make("efsignsgd").server_error_feedback
    assert EFSignSGD.update_space and not OneBit.update_space


# ---- layout ---------------------------------------------------------------------------------------------
def check_layout(name: str, params: dict, n: int, x: Optional[torch.Tensor] = None) -> None:
    """Payload size = plan = the independent formula; compress writes exactly its words and nothing else."""
    comp = make(name, **params)
    x = laplace(n, seed=n) if x is None else x
    for theta in levels(comp):
        plan = comp.plan(n, theta)
        assert plan.words == expected_words(name, params, n, theta)
        assert comp.wire_bytes(plan) == 4 * plan.words and comp.values_sent(plan) == n
        assert sum(s.words for s in plan.sections) == plan.words
        buf = torch.full((plan.words + 4,), 0x13579BDF, dtype=torch.int32)
        p = Payload(plan, buf[2:2 + plan.words])
        ctx = ctx_for(comp, n, world_size=3)
        comp.compress(x.clone(), plan, p, ctx, update_state=False)
        assert (buf[:2] == 0x13579BDF).all() and (buf[-2:] == 0x13579BDF).all()
        out = decode(comp, p, ctx)
        assert out.shape == (n,)
        if bool(torch.isfinite(x).all()):
            assert bool(torch.isfinite(out).all()), (name, params, n, theta)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_layout_sizes(variant) -> None:
    name, params = variant
    for n in (1, 2, 15, 16, 17, 31, 32, 33, 127, 128, 129, 1001):
        check_layout(name, params, n)


def test_layout_sections_in_wire_order() -> None:
    assert make("onebit").wire_layout(make("onebit").plan(100, 32)) == [("scale", torch.float32, 1),
                                                                       ("bits", torch.int32, 4)]
    assert make("terngrad").wire_layout(make("terngrad").plan(100, 8)) == [("range", torch.float32, 2),
                                                                          ("codes", torch.int32, 13)]
    assert make("qsgd").wire_layout(make("qsgd").plan(300, 4)) == [("norms", torch.float32, 3),
                                                                  ("codes", torch.int32, 75)]
    assert make("fp16").wire_layout(make("fp16").plan(5, 2)) == [("val", torch.float16, 5)]
    assert make("bf16").wire_layout(make("bf16").plan(5, 2)) == [("val", torch.bfloat16, 5)]
    assert make("tbq").wire_layout(make("tbq").plan(17, 16)) == [("codes", torch.int32, 2)]


@settings(max_examples=40, deadline=None, database=None)
@given(variant=st.sampled_from(VARIANTS), n=st.integers(1, 2000), seed=st.integers(0, 2 ** 16))
def test_layout_fuzz(variant, n: int, seed: int) -> None:
    check_layout(variant[0], variant[1], n, laplace(n, seed=seed, scale=10.0 ** (seed % 7 - 3)))


# ---- determinism ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_same_inputs_give_identical_words_whatever_the_buffer_held(variant) -> None:
    comp = make(*variant[:1], **variant[1])
    x = laplace(1003, seed=4)
    for theta in levels(comp):
        a = encode(comp, x, theta, ctx_for(comp, 1003, world_size=2), fill=0)
        b = encode(comp, x, theta, ctx_for(comp, 1003, world_size=2), fill=-1)
        assert torch.equal(a.words, b.words)


@pytest.mark.parametrize("variant", STOCHASTIC, ids=[v[0] for v in STOCHASTIC])
def test_stochastic_codes_follow_step_rank_and_role(variant) -> None:
    comp = make(variant[0], **variant[1])
    x = laplace(2000, seed=5)
    theta = levels(comp)[0]
    base = encode(comp, x, theta, ctx_for(comp, 2000, step=3)).words
    assert not torch.equal(base, encode(comp, x, theta, ctx_for(comp, 2000, step=4)).words)
    assert not torch.equal(base, encode(comp, x, theta, ctx_for(comp, 2000, step=3, rank=1)).words)
    assert not torch.equal(base, encode(comp, x, theta, ctx_for(comp, 2000, step=3, key="b0.p1")).words)
    q = alloc(comp, 2000, theta)
    comp.server_encode(x, q.plan, q, ctx_for(comp, 2000, step=3))
    assert not torch.equal(base, q.words), "the owner's re-encode draws from its own server stream"
    state = torch.random.get_rng_state()
    encode(comp, x, theta, ctx_for(comp, 2000, step=3))
    assert torch.equal(state, torch.random.get_rng_state()), "the global RNG is never touched"


@pytest.mark.parametrize("name", ["onebit", "signsgd", "efsignsgd", "tbq"])
def test_deterministic_codecs_reencode_like_workers(name: str) -> None:
    comp = make(name)
    x = laplace(500, seed=6)
    theta = levels(comp)[0]
    q = alloc(comp, 500, theta)
    comp.server_encode(x, q.plan, q, ctx_for(comp, 500))
    assert torch.equal(q.words, encode(comp, x, theta, ctx_for(comp, 500, rank=2, step=9)).words)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_sent_sq_norm_is_the_float64_energy_of_the_decode(variant) -> None:
    """The gain numerator, whatever shortcut a codec takes, equals ``Σ D(p)²`` of its own decode summed in float64
    — across more than one of the block kernels' 2^18-element blocks and with a partial last block."""
    name, params = variant
    for n in (1, 129, 600_001):
        comp = make(name, **params)
        x = laplace(n, seed=n, scale=3.0)
        for theta in levels(comp):
            ctx = ctx_for(comp, n, world_size=2)
            p = encode(comp, x, theta, ctx)
            got = comp.sent_sq_norm(p, ctx)
            assert got.dtype == torch.float64 and got.dim() == 0
            ref = float(decode(comp, p, ctx).double().square().sum())
            assert float(got) == pytest.approx(ref, rel=1e-12), (n, theta)


# ---- edge inputs -----------------------------------------------------------------------------------------
def edge_inputs(n: int) -> dict[str, torch.Tensor]:
    one = torch.zeros(n)
    one[n // 2] = -3.0
    mixed = torch.full((n,), 1e30)
    mixed[::2] = -3e38
    mixed[0] = 3.4e38
    return {"zeros": torch.zeros(n), "const+": torch.full((n,), 0.75), "const-": torch.full((n,), -2.5),
            "one-nonzero": one, "huge": mixed, "denormal": torch.full((n,), 1e-42) * (torch.arange(n) % 3 - 1),
            "tiny-range": 1e30 + laplace(n, seed=1) * 1e24}


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_finite_edge_inputs_decode_finite(variant) -> None:
    name, params = variant
    for n in (1, 2, 33, 300):
        for label, x in edge_inputs(n).items():
            comp = make(name, **params)
            for theta in levels(comp):
                ctx = ctx_for(comp, n, world_size=4)
                p = encode(comp, x, theta, ctx)
                out = decode(comp, p, ctx)
                assert bool(torch.isfinite(out).all()), (label, n, theta)
                if label == "zeros":
                    expect = torch.ones(n) if name == "signsgd" else torch.zeros(n)   # zero counts as +
                    assert torch.equal(out, expect), (label, n, theta)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_element_keeps_the_planned_size(variant, bad: float) -> None:
    name, params = variant
    for n in (1, 37):
        x = laplace(n, seed=2)
        x[n // 2] = bad
        check_layout(name, params, n, x)


@pytest.mark.parametrize("name", ["onebit", "terngrad", "ternary", "fp16", "bf16"])
def test_single_element_is_exact_where_the_scheme_allows(name: str) -> None:
    comp = make(name)
    for v in (0.3, -7.25) if name not in ("fp16", "bf16") else (0.375, -7.25):
        x = torch.tensor([v])
        for theta in levels(comp):
            ctx = ctx_for(comp, 1)
            assert torch.equal(decode(comp, encode(comp, x, theta, ctx), ctx), x), (v, theta)


# ---- fp16 / bf16 -------------------------------------------------------------------------------------------
def log_uniform(n: int, lo: float, hi: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp(torch.empty(n, dtype=torch.float64).uniform_(math.log(lo), math.log(hi), generator=g))
    sign = torch.randint(0, 2, (n,), generator=g).double() * 2 - 1
    return (mag * sign).float()


@pytest.mark.parametrize("name,lo,hi,bound", [("fp16", 2.0 ** -14, 65504.0, 2.0 ** -11),
                                              ("bf16", 1e-30, 1e30, 2.0 ** -8)])
def test_half_relative_error_one_rank(name: str, lo: float, hi: float, bound: float) -> None:
    comp = make(name)
    x = log_uniform(20000, lo, hi, seed=3)
    x[:2] = torch.tensor([lo, hi])
    ctx = ctx_for(comp, x.numel(), world_size=1)
    d = decode(comp, encode(comp, x, 2, ctx), ctx).double()
    rel = ((d - x.double()).abs() / x.double().abs()).max()
    assert rel <= bound
    x3 = x[(x.abs() >= 4 * lo) & (x.abs() <= hi / 2)]    # x/3 stays normal and below saturation
    three = ctx_for(comp, x3.numel(), world_size=3)      # pre-division by N adds only fp32 roundings
    d3 = decode(comp, encode(comp, x3, 2, three), three).double()
    assert ((d3 - x3.double()).abs() / x3.double().abs()).max() <= bound * (1 + 2.0 ** -10)


@pytest.mark.parametrize("name,span", [("fp16", 500), ("bf16", 30)])
def test_half_summability_is_exact_on_representable_sums(name: str, span: int) -> None:
    """Integer inputs, N = 4: x/4 and every partial sum are exact in the half dtype, so the reduced payload
    decodes to exactly the sum of the decodes and G is exactly the mean."""
    comp, ranks, n = make(name), 4, 999
    g = torch.Generator().manual_seed(7)
    xs = [torch.randint(-span, span + 1, (n,), generator=g).float() for _ in range(ranks)]
    ctxs = [ctx_for(comp, n, rank=w, world_size=ranks) for w in range(ranks)]
    ps = [encode(comp, x, 2, c) for x, c in zip(xs, ctxs)]
    reduced = alloc(comp, n, 2)
    for p in ps:   # the all-reduce SUM in the half dtype
        reduced["val"].add_(p["val"])
    sum_of_decodes = torch.zeros(n, dtype=torch.float64)
    for p, c in zip(ps, ctxs):
        comp.decompress(p, sum_of_decodes, accumulate=True, scale=1.0, ctx=c)
    assert torch.equal(decode(comp, reduced, ctxs[0], torch.float64), sum_of_decodes)
    out = torch.empty(n)
    comp.decompress(reduced, out, accumulate=False, scale=1.0 / ranks, ctx=ctxs[0])
    assert torch.equal(out, sum(xs) / ranks)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7, 8])
def test_half_sum_never_overflows(name: str, ranks: int) -> None:
    comp, n = make(name), 64
    top = 65504.0 if name == "fp16" else float(torch.finfo(torch.bfloat16).max)
    x = torch.full((n,), top)
    x[1::2] = -top
    x[2] = 1e6 if name == "fp16" else 3.4e38   # beyond the half range: saturates, never inf
    ctx = ctx_for(comp, n, world_size=ranks)
    p = encode(comp, x, 2, ctx)
    reduced = alloc(comp, n, 2)
    for _ in range(ranks):   # worst case: every rank sends the extreme values; the sum stays finite
        reduced["val"].add_(p["val"])
        assert bool(torch.isfinite(reduced["val"]).all())
    g = torch.empty(n)
    comp.decompress(reduced, g, accumulate=False, scale=1.0 / ranks, ctx=ctx)
    assert bool(torch.isfinite(g).all())
    assert ((g[3:] - x[3:]).abs() / top).max() <= 2.0 ** -8 * ranks


def test_half_error_feedback_law_and_pad_half() -> None:
    comp = make("fp16", error_feedback=True)
    x = laplace(7, seed=9)
    r = torch.full((7,), 5.0)
    ctx = ctx_for(comp, 7, world_size=3, residual=r)
    p = alloc(comp, 7, 2, fill=-1)
    comp.compress(x, p.plan, p, ctx, update_state=True)
    assert int(p.words[-1]) >> 16 == 0, "the unused half of the last word is zero"
    assert torch.equal(r, x - 3 * p["val"].float())
    as_float = Payload(p.plan, torch.full((p.plan.words,), 3.0))     # a float32 word buffer works the same
    comp.compress(x, p.plan, as_float, ctx_for(comp, 7, world_size=3), update_state=False)
    assert torch.equal(as_float.words.view(torch.int32), p.words)
    before = p.words.clone()
    decode(comp, p, ctx_for(comp, 7, world_size=3), torch.float16)  # decoding never touches the payload
    assert torch.equal(p.words, before)
    off = make("fp16")
    r2 = torch.full((7,), 5.0)
    off.compress(x, p.plan, p, ctx_for(off, 7, residual=r2), update_state=True)
    assert torch.equal(r2, torch.zeros(7)), "EF off: the residual left behind is zero"
    with pytest.raises(ValueError):
        off.decompress(p, torch.zeros(7), accumulate=False, scale=1.0, ctx=None)


# ---- onebit -----------------------------------------------------------------------------------------------
def test_onebit_mean_abs_preserves_l1_and_uses_two_levels() -> None:
    comp = make("onebit")
    for seed, n in ((1, 1000), (2, 33), (3, 4096)):
        x = laplace(n, seed=seed, scale=seed)
        ctx = ctx_for(comp, n)
        p = encode(comp, x, 32, ctx)
        d = decode(comp, p, ctx, torch.float64)
        s_ref = x.double().abs().mean()
        assert float(p["scale"][0]) == pytest.approx(float(s_ref), rel=1e-7)
        assert torch.equal(d, torch.where(x >= 0, 1.0, -1.0).double() * float(p["scale"][0]))
        assert float(d.abs().sum()) == pytest.approx(float(x.double().abs().sum()), rel=1e-6)
        assert float(comp.sent_sq_norm(p)) == pytest.approx(float(d.square().sum()), rel=1e-12)
        assert torch.equal(bitpack.unpack(p["bits"], 1, n).bool(), x >= 0)


def test_onebit_two_means_preserves_sum_and_uses_the_two_means() -> None:
    comp = make("onebit", scale="two_means")
    x = laplace(1001, seed=11) + 0.3
    ctx = ctx_for(comp, 1001)
    p = encode(comp, x, 32, ctx)
    d = decode(comp, p, ctx, torch.float64)
    xd = x.double()
    mu_pos, mu_neg = xd[xd >= 0].mean(), xd[xd < 0].mean()
    assert p["scale"].double().tolist() == pytest.approx([float(mu_pos), float(mu_neg)], rel=1e-7)
    assert set(d.unique().tolist()) == {float(p["scale"][0]), float(p["scale"][1])}
    assert torch.equal(d > 0, x >= 0)
    assert float(d.sum()) == pytest.approx(float(xd.sum()), rel=1e-6)
    assert float(comp.sent_sq_norm(p)) == pytest.approx(float(d.square().sum()), rel=1e-12)
    pos_only = torch.rand(50, generator=torch.Generator().manual_seed(1))
    q = encode(comp, pos_only, 32, ctx_for(comp, 50))
    assert float(q["scale"][1]) == 0.0 and float(decode(comp, q, ctx).sum()) == pytest.approx(float(pos_only.sum()))


# ---- signsgd ----------------------------------------------------------------------------------------------
def test_signsgd_sends_signs_zero_counts_positive() -> None:
    comp = make("signsgd")
    x = laplace(100, seed=3)
    x[::7] = 0.0
    ctx = ctx_for(comp, 100)
    assert torch.equal(decode(comp, encode(comp, x, 32, ctx), ctx), torch.where(x >= 0, 1.0, -1.0))
    assert float(comp.sent_sq_norm(encode(comp, x, 32, ctx))) == 100.0


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_signsgd_majority_vote_against_reference(ranks: int) -> None:
    comp, n = make("signsgd"), 517
    g = torch.Generator().manual_seed(ranks)
    bits = torch.randint(0, 2, (ranks, n), generator=g)
    if ranks % 2 == 0:
        bits[:, 0] = torch.tensor([1, 0] * (ranks // 2))   # a tie
    payloads = []
    for w in range(ranks):   # workers encode values whose signs are the bit matrix
        x = (bits[w].float() * 2 - 1) * torch.rand(n, generator=g).add(0.1)
        payloads.append(encode(comp, x, 32, ctx_for(comp, n, rank=w, world_size=ranks)))
    votes = [sum(2 * int(bits[w, i]) - 1 for w in range(ranks)) for i in range(n)]   # plain-Python reference
    y = torch.empty(n)
    owner = ctx_for(comp, n, rank=1, world_size=ranks)
    comp.merge_decode(payloads, y, owner)
    assert y.tolist() == votes
    q = alloc(comp, n, 32)
    comp.server_encode(y, q.plan, q, owner)
    assert bitpack.unpack(q["bits"], 1, n).tolist() == [1 if v >= 0 else 0 for v in votes]
    assert decode(comp, q, owner).tolist() == [1.0 if v >= 0 else -1.0 for v in votes]
    if ranks % 2 == 0:
        assert votes[0] == 0 and decode(comp, q, owner)[0] == 1.0, "a tie goes to +1"
    with pytest.raises(ValueError):
        comp.merge_decode(payloads, y, owner, server_residual=torch.zeros(n))


# ---- terngrad ------------------------------------------------------------------------------------------------
def mean_decode(comp, x: torch.Tensor, theta: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and max |D − x| over ``steps`` encodings, each with its own root seed."""
    acc = torch.zeros(x.numel(), dtype=torch.float64)
    worst = torch.zeros(x.numel(), dtype=torch.float64)
    for t in range(steps):
        ctx = ctx_for(comp, x.numel())
        ctx.seed = t
        d = decode(comp, encode(comp, x, theta, ctx), ctx, torch.float64)
        acc += d
        worst = torch.maximum(worst, (d - x.double()).abs())
    return acc / steps, worst


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_terngrad_unbiased_bounded_and_extremes_exact(bits: int) -> None:
    comp, steps = make("terngrad"), 1500
    x = laplace(64, seed=bits)
    theta = 32.0 / bits
    gap = (float(x.max()) - float(x.min())) / (2 ** bits - 1)
    mean, worst = mean_decode(comp, x, theta, steps)
    assert float((mean - x.double()).abs().max()) <= 5 * (gap / 2) / math.sqrt(steps)
    assert float(worst.max()) < gap * (1 + 1e-6)
    ctx = ctx_for(comp, 64, step=77)
    p = encode(comp, x, theta, ctx)
    d = decode(comp, p, ctx)
    i, j = int(x.argmin()), int(x.argmax())
    assert d[i] == x[i] and d[j] == x[j]
    codes = bitpack.unpack(p["codes"], bits, 64).double()
    assert int(codes.max()) <= 2 ** bits - 1
    on_grid = float(x.min()) + codes * gap
    assert torch.allclose(d.double(), torch.where(codes == 2 ** bits - 1, float(x.max()), on_grid), atol=1e-6 * gap)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_terngrad_deterministic_rounds_to_nearest(bits: int) -> None:
    comp = make("terngrad", stochastic=False)
    x = laplace(3001, seed=20 + bits)
    gap = (float(x.max()) - float(x.min())) / (2 ** bits - 1)
    ctx = ctx_for(comp, 3001)
    d = decode(comp, encode(comp, x, 32.0 / bits, ctx), ctx, torch.float64)
    assert float((d - x.double()).abs().max()) <= gap / 2 * (1 + 1e-5)
    assert d[int(x.argmin())] == float(x.min()) and d[int(x.argmax())] == float(x.max())


# ---- ternary -------------------------------------------------------------------------------------------------
def reference_clip(x: torch.Tensor, sigma: float) -> torch.Tensor:
    xd = x.double()
    c = sigma * float(torch.sqrt(((xd - xd.mean()) ** 2).mean()))
    return xd.clamp(-c, c) if sigma > 0 and c > 0 else xd


@pytest.mark.parametrize("sigma", [2.5, 1.0, 0.0])
def test_ternary_three_levels_and_mean_tends_to_clipped_input(sigma: float) -> None:
    comp, steps = make("ternary", clip_sigma=sigma), 2000
    x = laplace(80, seed=31)
    x[5] = 40.0   # an outlier that clipping cuts
    clipped = reference_clip(x, sigma)
    s = float(clipped.abs().max())
    mean, _ = mean_decode(comp, x, 16, steps)
    assert float((mean - clipped).abs().max()) <= 5 * (s / 2) / math.sqrt(steps)
    ctx = ctx_for(comp, 80, step=5)
    p = encode(comp, x, 16, ctx)
    assert float(p["scale"][0]) == pytest.approx(s, rel=1e-6)
    d = decode(comp, p, ctx)
    sf = float(p["scale"][0])
    assert set(d.unique().tolist()) <= {-sf, 0.0, sf}
    assert bool((d * x.double() >= 0).all()), "never the opposite sign"
    assert bitpack.unpack(p["codes"], 2, 80).max() <= 2
    nz = int((d != 0).sum())
    assert float(comp.sent_sq_norm(p)) == pytest.approx(nz * sf * sf, rel=1e-12)


def test_ternary_error_feedback_keeps_the_clipped_part() -> None:
    comp = make("ternary", error_feedback=True)
    x = laplace(200, seed=8)
    x[0] = 100.0
    r = torch.empty(200)
    ctx = ctx_for(comp, 200, residual=r)
    p = alloc(comp, 200, 16)
    comp.compress(x, p.plan, p, ctx, update_state=True)
    assert torch.equal(r, x - decode(comp, p, ctx))
    assert float(r[0]) > 100.0 - float(p["scale"][0]) - 1e-4 and float(p["scale"][0]) < 50.0


def test_ternary_zero_spread_is_not_clipped_away() -> None:
    comp = make("ternary")
    for x in (torch.full((10,), 3.0), torch.tensor([-2.0])):
        ctx = ctx_for(comp, x.numel())
        assert torch.equal(decode(comp, encode(comp, x, 16, ctx), ctx), x)


# ---- qsgd --------------------------------------------------------------------------------------------------
def block_norms(x: torch.Tensor, b: int) -> torch.Tensor:
    xd = torch.zeros(math.ceil(x.numel() / b) * b, dtype=torch.float64)
    xd[:x.numel()] = x.double()
    return xd.view(-1, b).norm(dim=1)


@pytest.mark.parametrize("levels_,bucket", [(1, 128), (7, 128), (127, 128), (7, 10), (127, 1)])
def test_qsgd_codes_bounds_unbiasedness_and_variance(levels_: int, bucket: int) -> None:
    comp, n, steps = make("qsgd", bucket_size=bucket), 300, 800
    theta = {1: 16.0, 7: 8.0, 127: 4.0}[levels_]
    x = laplace(n, seed=levels_)
    x[128:138] = 0.0                       # a partly empty block
    nu = block_norms(x, bucket)
    nu_e = nu.repeat_interleave(bucket)[:n]
    acc = torch.zeros(n, dtype=torch.float64)
    sq_err = torch.zeros(nu.numel(), dtype=torch.float64)
    for t in range(steps):
        ctx = ctx_for(comp, n, step=t)
        p = encode(comp, x, theta, ctx)
        if t == 0:
            assert torch.allclose(p["norms"].double(), nu, rtol=1e-6)
            width = {1: 2, 7: 4, 127: 8}[levels_]
            code = bitpack.unpack(p["codes"], width, n).long() - levels_
            assert int(code.abs().max()) <= levels_
            assert bool((code * x.sign().long() >= 0).all())
        d = decode(comp, p, ctx, torch.float64)
        assert bool(((d - x.double()).abs() <= nu_e / levels_ * (1 + 1e-6) + 1e-12).all())
        acc += d
        err = torch.zeros(nu.numel() * bucket, dtype=torch.float64)
        err[:n] = (d - x.double()) ** 2
        sq_err += err.view(-1, bucket).sum(dim=1)
    sd = nu_e / levels_ / 2
    assert bool(((acc / steps - x.double()).abs() <= 5 * sd / math.sqrt(steps) + 1e-12).all())
    bound = min(bucket / levels_ ** 2, math.sqrt(bucket) / levels_) * nu ** 2
    assert bool((sq_err / steps <= bound * 1.1 + 1e-12).all())


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e-20, 1.0, 1e18, 1e30])
def test_qsgd_block_norms_at_every_scale(scale: float) -> None:
    """The fp32 fast pass and its rescaled fallback (squares that underflow or overflow) both give the block
    norms of a float64 reference; an all-zero block gives 0, the blocks beside it are unaffected."""
    comp, n = make("qsgd"), 1024
    x = laplace(n, seed=8) * scale
    x[256:384] = 0.0
    p = encode(comp, x, 4.0, ctx_for(comp, n))
    ref = block_norms(x, 128)
    assert float(p["norms"][2]) == 0.0
    assert torch.allclose(p["norms"].double(), ref, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("theta", [4.0, 8.0, 16.0])
def test_qsgd_regular_and_irregular_kernel_blocks_side_by_side(theta: float) -> None:
    """The encoder skips its NaN/inf pass on kernel blocks whose quantization blocks all have regular norms: a
    partition of three 2^18-element kernel blocks — regular, then one with an empty, a huge and a non-finite
    quantization block, then regular — decodes within ``ν/s`` of x on every finite block, to exact zeros on the
    empty one, and to codes within ``[−s, s]`` everywhere (float64 reference norms)."""
    comp, n = make("qsgd"), 3 * (1 << 18)
    s = {4.0: 127, 8.0: 7, 16.0: 1}[theta]
    x = laplace(n, seed=11)
    lo = (1 << 18) + 4096
    x[lo:lo + 128] = 0.0                      # an empty quantization block (0/0 in the scaled values)
    x[lo + 128:lo + 256] *= 1e30              # squares overflow fp32: the rescaled norm
    x[lo + 300] = float("inf")                # a non-finite block: its codes must still be in range
    p = encode(comp, x, theta, ctx_for(comp, n))
    code = bitpack.unpack(p["codes"], {127: 8, 7: 4, 1: 2}[s], n).long() - s
    assert int(code.abs().max()) <= s
    assert bool((code[lo:lo + 128] == 0).all())
    d = decode(comp, p, ctx_for(comp, n)).double()
    finite = torch.ones(n, dtype=torch.bool)
    finite[lo + 256:lo + 384] = False
    nu_e = block_norms(x, 128).repeat_interleave(128)[:n]
    err = (d - x.double()).abs()[finite]
    assert bool((err <= nu_e[finite] / s * (1 + 1e-6) + 1e-30).all())


def test_qsgd_variance_bound_is_tight_enough_to_matter() -> None:
    """Equal magnitudes in a block (the worst case of the √B/s term at s = 1): the empirical variance comes
    close to, and stays below, the bound."""
    comp, b, steps = make("qsgd", bucket_size=16), 16, 1500
    x = torch.full((b,), 0.5) * (torch.arange(b) % 2 * 2 - 1)
    nu2 = float(x.double().square().sum())
    total = 0.0
    for t in range(steps):
        ctx = ctx_for(comp, b, step=t)
        total += float((decode(comp, encode(comp, x, 16.0, ctx), ctx, torch.float64) - x.double()).square().sum())
    bound = min(b / 1, math.sqrt(b) / 1) * nu2
    assert 0.5 * bound < total / steps <= 1.1 * bound


# ---- tbq -----------------------------------------------------------------------------------------------------
def test_tbq_residual_law_and_code_conditions() -> None:
    comp = make("tbq", tau=0.5)
    n = 1000
    mem = torch.zeros(n)
    for t in range(12):
        g = laplace(n, seed=t, scale=0.3)
        g[:3] = torch.tensor([0.5, -0.5, 0.49999997])   # exactly at ±τ and just below
        ctx = ctx_for(comp, n, step=t)
        ctx.memory = {"r": mem}
        x = torch.empty(n)
        comp.memory.compensate(g, x, ctx)
        pre = mem + g
        assert torch.equal(x, pre) and torch.equal(mem, ctx.memory["r"]), "compensate reads, never writes"
        p = alloc(comp, n, 16)
        comp.compress(x, p.plan, p, ctx, update_state=True)
        q = bitpack.unpack(p["codes"], 2, n).long()
        assert torch.equal(q == 2, pre >= 0.5) and torch.equal(q == 0, pre <= -0.5)
        assert torch.equal(q == 1, (pre > -0.5) & (pre < 0.5))
        d = decode(comp, p, ctx)
        assert set(d.unique().tolist()) <= {-0.5, 0.0, 0.5}
        assert torch.equal(x, pre - d), "r_new = r_old + g − D(p), bitwise"
        assert float(comp.sent_sq_norm(p)) == 0.25 * int((q != 1).sum())
        assert float(comp.sent_sq_norm(p)) <= float(pre.double().square().sum())
        mem = x.clone()
    ctx.memory = {"r": mem}
    comp.memory.dense_sent(torch.zeros(n), ctx)
    assert not mem.any()


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
