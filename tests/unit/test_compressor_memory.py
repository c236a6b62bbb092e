"""Memory rules (compress/memory.py): a plug-in written for the contract up to 0.4, whose memory hooks live on the
compressor itself, keeps working through a forwarding rule — bitwise the state of the built-in rule it mirrors."""
from __future__ import annotations

from typing import Sequence

import pytest
import torch

from ds_gravac.compress.base import CompressCtx, Payload
from ds_gravac.compress.memory import CompressorMemory
from ds_gravac.compress import registry
from ds_gravac.compress.registry import lookup, register_compressor, registered_names
from ds_gravac.config_aliases import GravacDeprecationWarning
from ds_gravac.sync.buckets import Bucket, Member
from ds_gravac.sync.memory import BucketMemory

TopK = lookup("topk")


def _legacy_ef21() -> type:
    """EF21 as a plug-in would have written it up to 0.4: slots and hooks on the compressor."""
    with pytest.warns(GravacDeprecationWarning, match="OldEF21 defines memory_slots, input_slot, compensate"):
        class OldEF21(TopK):
            owns_state = True
            memory_slots = ("h", "H")
            input_slot = "h"

            def compensate(self, g: torch.Tensor, out: torch.Tensor, ctx: CompressCtx) -> None:
                torch.sub(g, ctx.memory["h"], out=out)

            def commit(self, x: torch.Tensor, p: Payload, ctx: CompressCtx) -> None:
                x.copy_(ctx.memory["h"])
                self.decompress(p, x, accumulate=True, scale=1.0, ctx=ctx)

            def dense_sent(self, g: torch.Tensor, ctx: CompressCtx) -> None:
                ctx.memory["h"].copy_(g)

            def commit_aggregate(self, x: torch.Tensor, g: torch.Tensor, payloads: Sequence[Payload],
                                 ctx: CompressCtx) -> None:
                ctx.memory["H"].add_(g)
                g.copy_(ctx.memory["H"])
    return OldEF21


def _run(comp, steps: int = 4) -> dict[str, torch.Tensor]:
    """Stage, encode with the memory update, commit (compressed, then one dense step, then compressed) and fold
    the aggregate into the memory: the whole per-tensor transaction on one rank."""
    bucket = Bucket(index=0, compressible=True, dtype=torch.float32)
    param = torch.nn.Parameter(torch.zeros(257))
    bucket.add(Member(index=0, name="w", param=param, compressible=True))
    mem = BucketMemory(bucket, comp.Memory.slots, comp.Memory.input_slot)
    gen = torch.Generator().manual_seed(7)
    for step in range(steps):
        param.grad = torch.randn(257, generator=gen)
        ctxs = [CompressCtx(key="w", step=step, shape=(257,), param=param)]
        xs = mem.stage(comp, ctxs, True)
        if step == 2:
            mem.commit_dense(comp, ctxs)
            continue
        plan = comp.plan(257, 8.0)
        out = Payload.allocate(plan)
        ctxs[0].residual = xs[0]
        comp.compress(xs[0], plan, out, ctxs[0], update_state=True)
        mem.commit_compressed(comp, [out], ctxs)
        agg = torch.zeros(257)
        comp.decompress(out, agg, accumulate=False, scale=1.0, ctx=ctxs[0])
        ctxs[0].memory = mem.member_memory(0)
        comp.memory.commit_aggregate(mem.views(mem.slots["h"])[0], agg, [out], ctxs[0])
    return {name: buf.clone() for name, buf in mem.slots.items()}


def test_legacy_plugin_hooks_are_forwarded_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = _legacy_ef21()
    assert issubclass(legacy.Memory, CompressorMemory) and legacy.Memory.slots == ("h", "H")
    registered_names()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))   # no registration leaks out
    assert register_compressor("oldef21", legacy) is legacy          # the contract check accepts it
    old, new = _run(legacy()), _run(lookup("ef21")())
    assert old.keys() == new.keys() == {"h", "H"}
    for name in old:
        assert torch.equal(old[name], new[name]), name
    assert bool(old["H"].any())


def test_a_class_without_legacy_hooks_keeps_its_rule() -> None:
    class Plain(TopK):
        pass

    assert Plain.Memory is TopK.Memory is CompressorMemory
