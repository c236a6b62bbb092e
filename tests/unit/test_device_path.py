"""The device path's own kernels: counter-based draws (against an independent SplitMix64 in Python, and the
statistics stochastic rounding needs), and the quantizers' unbiased decodes with those draws."""
from __future__ import annotations

import torch

from ds_gravac.compress.base import CompressCtx, Payload
from ds_gravac.compress.counter_rng import CounterStream, splitmix_block
from ds_gravac.compress.device_path import force_device_path, host_kernels
from ds_gravac.compress.registry import lookup

M64 = (1 << 64) - 1


def splitmix_reference(seed: int, i: int) -> int:
    """The i-th output of SplitMix64 from state ``seed``, written from its definition (not the module's helper)."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def test_draws_are_splitmix64_bit_for_bit() -> None:
    for seed in (0, 1, 2**62 + 12345, M64):
        got = [v & M64 for v in splitmix_block(seed, 1000, 50, torch.device("cpu")).tolist()]
        assert got == [splitmix_reference(seed, i) for i in range(1000, 1050)]


def test_a_stream_continues_across_calls_and_is_the_same_on_every_rank() -> None:
    a, b = CounterStream(99), CounterStream(99)
    whole = a.uniform_(torch.empty(17))
    parts = torch.cat([b.uniform_(torch.empty(10)), b.uniform_(torch.empty(7))])
    assert torch.equal(whole, parts)
    assert not torch.equal(CounterStream(100).uniform_(torch.empty(17)), whole)


def test_uniform_and_dither_statistics() -> None:
    n = 1 << 20
    u = CounterStream(7).uniform_(torch.empty(n))
    assert u.min() >= 0 and u.max() < 1 and torch.equal(u * 2**24, (u * 2**24).round())    # the 24-bit grid
    assert abs(float(u.double().mean()) - 0.5) < 3 * (1 / 12 / n) ** 0.5 * 3
    counts = torch.histc(u, bins=64, min=0, max=1).double()
    chi2 = float(((counts - n / 64) ** 2 / (n / 64)).sum())
    assert chi2 < 120                                  # 63 degrees of freedom: p ≈ 1e-5
    v = CounterStream(8).uniform_(torch.empty(n))
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 5 / n ** 0.5          # other seed: independent
    d = CounterStream(9).dither_(torch.empty(n), 3.0)
    k = (d - 3.0 - 2.0 ** -16) * 2**15
    assert torch.equal(k, k.round()) and k.min() >= 0 and k.max() <= 2**15 - 1
    assert abs(float(d.double().mean()) - 3.5) < 1e-3


def test_device_path_switch() -> None:
    t = torch.zeros(3)
    assert host_kernels(t)
    with force_device_path():
        assert not host_kernels(t)
        with force_device_path(False):
            assert host_kernels(t)
    assert host_kernels(t)


def _decode_mean(name: str, x: torch.Tensor, steps: int) -> torch.Tensor:
    comp = lookup(name)()
    plan = comp.tensor_plan(tuple(x.shape), float(comp.default_cf()))
    total = torch.zeros_like(x, dtype=torch.float64)
    for step in range(steps):
        ctx = CompressCtx(key="w", step=step, seed=3, shape=tuple(x.shape))
        p = Payload(plan, torch.zeros(plan.words, dtype=torch.int32))
        comp.compress(x.clone(), plan, p, ctx, update_state=False)
        out = torch.zeros_like(x)
        comp.decompress(p, out, accumulate=False, scale=1.0, ctx=ctx)
        total += out
    return total / steps


def test_stochastic_rounding_with_counter_draws_is_unbiased() -> None:
    """E[D(C(x))] = x for the stochastic quantizers on the device path (their draws are counter-based there)."""
    x = torch.randn(257, generator=torch.Generator().manual_seed(0))
    with force_device_path():
        for name in ("qsgd", "terngrad"):
            mean = _decode_mean(name, x, 200)
            err = float((mean - x.double()).abs().max() / x.abs().max())
            assert err < 0.1, (name, err)


def test_randomk_order_on_the_device_path_is_a_uniform_nested_order() -> None:
    """Random-k's shared order from counter keys: distinct indices, prefixes nested across k, the same on every
    rank (a pure function of seed, step and key), and each index equally likely in a k-prefix."""
    from ds_gravac.compress.randomk import random_order
    cpu = torch.device("cpu")
    with force_device_path():
        a, b = random_order(1000, 50, 1, 2, 3, cpu), random_order(1000, 20, 1, 2, 3, cpu)
        assert torch.equal(a[:20], b) and a.unique().numel() == 50 and a.min() >= 0 and a.max() < 1000
        assert torch.equal(a, random_order(1000, 50, 1, 2, 3, cpu))
        counts = torch.zeros(100, dtype=torch.float64)
        for step in range(1000):
            counts[random_order(100, 10, 1, step, 3, cpu)] += 1
    chi2 = float(((counts - 100) ** 2 / (100 * 0.9)).sum())     # binomial(1000, 0.1) per index
    assert chi2 < 160                                            # 99 degrees of freedom: p ≈ 1e-4


def test_side_streams_are_no_ops_off_cuda() -> None:
    """On CPU the side stream context runs its block in place and creates no stream; ``join`` has nothing to do."""
    from ds_gravac.sync.streams import SideStreams
    streams, ran = SideStreams(), []
    g = torch.ones(3)
    with streams.launch(torch.device("cpu"), [g, None]):
        ran.append(True)
    streams.join()
    assert ran == [True] and streams._side == {}
