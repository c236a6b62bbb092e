"""QSGD and TBQ against float64 references written here: codes, block norms at every scale, unbiasedness,
the variance bound, TBQ's residual law."""
from __future__ import annotations

import math

import pytest
import torch

from ds_gravac.compress import bitpack
from quantizer_cases import alloc, ctx_for, decode, encode, laplace, make


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
