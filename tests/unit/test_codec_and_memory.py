"""The bucket codec's multi-level probes, the memory's transaction and tensor-size classification, in one
process."""
from __future__ import annotations

import logging

import pytest
import torch

from ds_gravac.compress.base import CompressCtx
from ds_gravac.compress.registry import lookup
from ds_gravac.sync.buckets import INT32_LIMIT, Bucket, Member, classify
from ds_gravac.sync.codec import BucketCodec
from ds_gravac.sync.memory import BucketMemory


def _bucket(sizes: list[int]) -> Bucket:
    bucket = Bucket(index=0, compressible=True, dtype=torch.float32)
    for i, n in enumerate(sizes):
        bucket.add(Member(index=i, name=f"t{i}", param=torch.nn.Parameter(torch.zeros(n)), compressible=True))
    return bucket


class SpyTopK(lookup("topk")):
    """Top-k that records which payload every derived level was computed from."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float, float]] = []

    def compress(self, x, plan, out, ctx, update_state):
        self.calls.append(("direct", plan.level, 0.0))
        return super().compress(x, plan, out, ctx, update_state)

    def compress_from(self, p1, x, plan2, out, ctx):
        self.calls.append(("derived", plan2.level, p1.plan.level))
        return super().compress_from(p1, x, plan2, out, ctx)


def test_probes_above_theta_min_derive_from_theta_min_and_lower_ones_compress_directly() -> None:
    comp = SpyTopK()
    bucket = _bucket([50000])
    codec = BucketCodec(bucket, comp, [CompressCtx(key="t0")])
    x = torch.randn(50000, generator=torch.Generator().manual_seed(0))
    probes = (10.0, 40.0, 160.0, 5.0)            # θ_min first, then θ_c, a refresh CF, and one below θ_min
    lay, st = codec.encode([x], (40.0,), probes, [True] * 4)
    assert sorted(comp.calls) == sorted([("direct", 10.0, 0.0), ("derived", 40.0, 10.0), ("derived", 160.0, 10.0),
                                         ("direct", 5.0, 0.0)])
    # the sent level was encoded straight into the send buffer: equal to a direct encoding at 40x
    direct, _ = BucketCodec(bucket, lookup("topk")(), [CompressCtx(key="t0")]).encode([x], (40.0,), (), ())
    assert torch.equal(lay.send, direct.send)
    for level, num in zip(probes, st.nums):      # each gain numerator is that level's ‖C(x)‖² (Top-k: exact)
        k = -(-50000 // int(level))
        assert num == pytest.approx(float(x.double().abs().topk(k).values.square().sum()), rel=1e-6)


def test_memory_commits_only_when_asked() -> None:
    comp = lookup("topk")()
    bucket = _bucket([1000, 3000])
    mem = BucketMemory(bucket, ("residual",), "residual")
    codec = BucketCodec(bucket, comp, [CompressCtx(key=m.name) for m in bucket.members])
    mem.slots["residual"].normal_(generator=torch.Generator().manual_seed(1))
    r0 = mem.slots["residual"].clone()
    for m in bucket.members:
        m.param.grad = torch.randn(m.numel, generator=torch.Generator().manual_seed(m.index + 5))
    xs = mem.stage(comp, codec.ctxs, True)
    for ctx, x in zip(codec.ctxs, xs):
        ctx.residual = x
    x_all = torch.cat([x.clone() for x in xs])
    lay, _ = codec.encode(xs, (10.0, 10.0), (), ())
    codec.leave_memory(xs, lay)
    assert torch.equal(mem.slots["residual"], r0), "staging and encoding never touch the memory"
    assert torch.equal(x_all, r0 + torch.cat([m.param.grad for m in bucket.members]))
    mem.commit_compressed(comp, lay.payloads, codec.ctxs)
    sent = torch.zeros_like(x_all)
    for i, p in enumerate(lay.payloads):
        comp.decompress(p, codec.seg(sent, i), accumulate=False, scale=1.0, ctx=codec.ctxs[i])
    assert torch.equal(mem.slots["residual"] + sent, x_all), "committed memory = x − D(p)"


def test_huge_tensors_are_sent_dense_instead_of_refused(caplog: pytest.LogCaptureFixture) -> None:
    with torch.device("meta"):
        huge = torch.nn.Parameter(torch.empty(INT32_LIMIT))
        small = torch.nn.Parameter(torch.empty(1000))
    with caplog.at_level(logging.WARNING, logger="ds_gravac"):
        members = classify([("huge", huge), ("small", small)], lambda shape: True, 0, True)
    assert [m.compressible for m in members] == [False, True]
    assert "'huge' has 2147483648 elements" in caplog.text


def test_end_step_drops_unused_levels_and_says_so() -> None:
    """A level neither sent nor probed in a step loses its buffers; the synchronizer then trims the host heap."""
    from ds_gravac.sync.host_memory import release_freed_host_memory
    bucket = _bucket([50000])
    codec = BucketCodec(bucket, lookup("topk")(), [CompressCtx(key="t0")])
    x = torch.randn(50000, generator=torch.Generator().manual_seed(1))
    codec.encode([x], (10.0,), (10.0, 40.0), [True, True])
    held = codec.nbytes()
    assert codec.end_step() is False                 # both levels were used: nothing dropped
    codec.encode([x], (100.0,), (), ())
    assert codec.end_step() is True                  # the 10x layout and the 40x probe buffer went away
    assert 0 < codec.nbytes() < held
    assert isinstance(release_freed_host_memory(), bool)


@pytest.mark.parametrize("compressor", ["powersgd", "dgc"])
def test_commits_form_the_fp32_gradient_only_for_compressors_that_read_it(compressor: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 gradient becomes an fp32 copy whenever the memory hands it to the compressor. PowerSGD keeps no memory
    besides its error (the base ``commit_memory`` and ``dense_sent``, which never read it), so its commits must not
    form that copy; DGC updates its momentum from it, so its commits must."""
    comp = lookup(compressor)()
    bucket = Bucket(index=0, compressible=True, dtype=torch.bfloat16)
    for i in range(2):
        p = torch.nn.Parameter(torch.zeros(64, 32, dtype=torch.bfloat16))
        p.grad = torch.randn(64, 32, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
        bucket.add(Member(index=i, name=f"t{i}", param=p, compressible=True))
    mem = BucketMemory(bucket, comp.Memory.slots, comp.Memory.input_slot)
    ctxs = [CompressCtx(key=m.name, shape=tuple(m.param.shape), param=m.param) for m in bucket.members]
    mem.stage(comp, ctxs, True)
    formed: list[str] = []
    original = BucketMemory.grad
    monkeypatch.setattr(BucketMemory, "grad", lambda self, m: formed.append(m.name) or original(self, m))
    mem.commit_dense(comp, ctxs)
    assert formed == ([] if compressor == "powersgd" else ["t0", "t1"])
    assert not any(bool(buf.any()) for name, buf in mem.slots.items() if name != "u"), "a dense send clears them"
    if compressor == "powersgd":        # PowerSGD's error is its input slot: nothing else to commit
        mem.commit_compressed(comp, [None, None], ctxs)
        assert formed == []


def test_a_dense_commit_leaves_a_residual_that_staging_need_not_read() -> None:
    """After a dense step the residual is zero and known to be: the next stage is ``x = g`` (as with a zero
    residual read), a second dense commit clears nothing, and a compressed commit makes the residual live again."""
    comp = lookup("topk")()
    bucket = _bucket([1000, 3000])
    mem = BucketMemory(bucket, ("residual",), "residual")
    codec = BucketCodec(bucket, comp, [CompressCtx(key=m.name) for m in bucket.members])
    gen = torch.Generator().manual_seed(2)
    mem.slots["residual"].normal_(generator=gen)
    assert not mem.residual_zero                          # a fresh memory may have been written: read it

    def grads() -> torch.Tensor:
        for m in bucket.members:
            m.param.grad = torch.randn(m.numel, generator=gen)
        return torch.cat([m.param.grad for m in bucket.members])

    g = grads()
    r0 = mem.slots["residual"].clone()
    assert torch.equal(torch.cat(mem.stage(comp, codec.ctxs, True)), r0 + g)
    mem.commit_dense(comp, codec.ctxs)
    assert mem.residual_zero and not mem.slots["residual"].any()
    g = grads()
    xs = mem.stage(comp, codec.ctxs, True, inv_scale=0.5)
    assert torch.equal(torch.cat(xs), 0.5 * g)
    for ctx, x in zip(codec.ctxs, xs):
        ctx.residual = x
    lay, _ = codec.encode(xs, (10.0, 10.0), (), ())
    codec.leave_memory(xs, lay)
    mem.commit_compressed(comp, lay.payloads, codec.ctxs)
    assert not mem.residual_zero and mem.slots["residual"].any()
    r1 = mem.slots["residual"].clone()
    g = grads()
    assert torch.equal(torch.cat(mem.stage(comp, codec.ctxs, True)), r1 + g)
