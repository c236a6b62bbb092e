"""Shared cases of the quantizer tests: the codecs, their variants, and helpers that encode and decode one
tensor through the compressor contract."""
from __future__ import annotations

import math
from typing import Optional

import torch

from ds_gravac.compress.base import CompressCtx, Payload
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
