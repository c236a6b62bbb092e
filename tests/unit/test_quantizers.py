"""Quantizer codecs (fp16, bf16, onebit, signsgd, efsignsgd, terngrad, ternary, qsgd, tbq): the contract,
layouts, determinism and edge inputs, every variant alike (per-scheme invariants: test_quantizer_schemes and
test_quantizer_qsgd; memory and the parameter-server exchange: test_quantizer_memory)."""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ds_gravac.compress.base import Kind, Payload, check_contract
from ds_gravac.compress.efsignsgd import EFSignSGD
from ds_gravac.compress.onebit import OneBit
from quantizer_cases import (CLASSES, IDS, STOCHASTIC, VARIANTS, alloc, ctx_for, decode, encode, expected_words,
                             laplace, levels, make)


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
