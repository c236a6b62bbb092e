"""Each half-precision, sign and ternary quantizer against float64 references written here: what it sends,
its bias, its bounds and its error-feedback law."""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.compress import bitpack
from ds_gravac.compress.base import Payload
from quantizer_cases import alloc, ctx_for, decode, encode, laplace, make


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
