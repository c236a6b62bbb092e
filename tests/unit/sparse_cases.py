"""Shared cases of the sparsifier tests: the compressors by family and helpers that encode, decode and read the
selection of one tensor through the compressor contract."""
from __future__ import annotations

import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress.base import CompressCtx, Kind, Payload
from ds_gravac.compress.registry import lookup
from ds_gravac.sync.buckets import Bucket, Member
from ds_gravac.sync.memory import BucketMemory

SPARSE = ["topk", "dgc", "redsync", "sidco", "threshold", "graddrop"]
EXTERNAL_EF = ["topk", "randomk", "redsync", "sidco", "threshold", "graddrop"]
ALL = SPARSE + ["randomk"]

# ---- helpers --------------------------------------------------------------------------------------------
def make(name: str, **params):
    cls = lookup(name)
    return cls(cls.Params(**params))


def laplace(n: int, seed: int = 0, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs()) * scale).to(dtype)


def distinct(n: int, seed: int = 0) -> torch.Tensor:
    """Distinct magnitudes with random signs and positions (exact sort references are unambiguous)."""
    g = torch.Generator().manual_seed(seed)
    mags = (torch.randperm(n, generator=g) + 1).float() / n
    signs = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return mags * signs


def ctx_for(key: str = "layer.weight", step: int = 1, rank: int = 0, residual=None, **kw) -> CompressCtx:
    return CompressCtx(key=key, step=step, rank=rank, residual=residual, **kw)


def alloc(comp, numel: int, level: float) -> Payload:
    plan = comp.plan(numel, level)
    return Payload.allocate(plan, torch.float32 if comp.kind == Kind.SUMMABLE else torch.int32)


def tensor_memory(comp, n: int, key: str = "layer.weight", dtype: torch.dtype = torch.float32):
    """The synchronizer's memory for one tensor (production code); its parameter carries the gradient."""
    param = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
    bucket = Bucket(index=0, compressible=True, dtype=dtype)
    bucket.add(Member(index=0, name=key, param=param, compressible=True))
    return BucketMemory(bucket, comp.Memory.slots, comp.Memory.input_slot, dtype=dtype), param


_MEMORIES: dict = {}


def memory_of(comp, n: int, key: str, dtype: torch.dtype):
    k = (id(comp), key)
    if k not in _MEMORIES:
        _MEMORIES[k] = (comp, *tensor_memory(comp, n, key, dtype))   # comp kept alive: ids stay unique
    return _MEMORIES[k][1:]


def encode(comp, x: torch.Tensor, level: float, ctx: CompressCtx, update_state: bool = False):
    """One step of a tensor as the synchronizer runs it: compressors with their own memory stage through the
    memory object, encode, and (``update_state``) commit the sent payload."""
    p = alloc(comp, x.numel(), level)
    if comp.owns_state:
        mem, param = memory_of(comp, x.numel(), ctx.key, x.dtype)
        param.grad = x.detach().clone()
        xs = mem.stage(comp, [ctx], True)
        m = comp.compress(xs[0], p.plan, p, ctx, False)
        if update_state:
            comp.memory.commit(xs[0], p, ctx)
            mem.commit_compressed(comp, [p], [ctx])
        return p, int(m)
    m = comp.compress(x, p.plan, p, ctx, update_state)
    return p, int(m)


def decode(comp, p: Payload, ctx: CompressCtx, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = torch.full((p.plan.numel,), 7.0, dtype=dtype)   # garbage: accumulate=False must overwrite
    comp.decompress(p, out, accumulate=False, scale=1.0, ctx=ctx)
    return out


def selected(comp, p: Payload, ctx: CompressCtx) -> torch.Tensor:
    if comp.kind == Kind.SUMMABLE:
        return comp.indices(p.plan.numel, p.plan, ctx)
    return p["idx"][:sel.real_count(p["idx"], p["val"])].long()
