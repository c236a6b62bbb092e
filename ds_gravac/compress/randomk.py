"""``randomk``: shared uniformly random coordinates, values only, summable.

The index set comes from a *shared* stream (no rank), so every rank picks the same coordinates and the
values can be all-reduced. Indices are never sent: they are regenerated from ``(seed, step, key, k)``.

Construction: S(k) is the first k distinct values of an i.i.d. uniform stream over ``[0, n)`` (drawn in
blocks of a fixed size schedule), which is a uniformly random k-subset in a uniformly random order. Once
``n//2`` distinct values are found, the remaining indices follow in a shared random permutation, so the
order is a uniform permutation of ``[0, n)`` and S(k2) is the length-k2 prefix of S(k1). Multi-level stage
2 therefore takes a uniform k2-subset of S from the same shared randomness, and its payload decodes from
``(key, step, k2)`` alone — a derived payload and a direct one at k2 are identical.
"""
from __future__ import annotations

import math
import warnings
from typing import Literal, Optional

import torch

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with deepspeed
    np = None

from . import sparse_select as sel
from .base import (CompressCtx, Compressor, CompressorParams, Kind, Payload, Section, TensorPlan, generator,
    k_for, mix_seed, stable_hash)
from .kinds import GainKind, Multilevel
from .counter_rng import splitmix_block
from .device_path import host_kernels

Tensor = torch.Tensor
STREAM_RANDOMK = 0x726E_646B          # shared: i.i.d. draws
STREAM_RANDOMK_TAIL = 0x726E_6474     # shared: permutation of the second half
FIRST_BLOCK = 1024
BLOCK_GROWTH = 1.25                   # fixed block-size schedule: prefixes never depend on k


def _first_distinct(draws: Tensor, n: int) -> Tensor:
    """Distinct values of ``draws`` (in ``[0, n)``) in order of first appearance."""
    m = draws.numel()
    if sel.on_numpy(draws) and m * 16 >= n:
        # dense draws: O(n + m) "earliest position per value" beats sorting (measured 6x at m = n/10)
        dn = draws.numpy()
        first = np.full(n, m, dtype=np.int64)
        np.minimum.at(first, dn, np.arange(m))
        return torch.from_numpy(dn[first[dn] == np.arange(m)])
    order = torch.sort(draws, stable=True)
    sv, perm = order.values, order.indices
    keep = torch.ones_like(sv, dtype=torch.bool)
    keep[1:] = sv[1:] != sv[:-1]
    return draws.index_select(0, perm[keep].sort().values)   # first occurrences, back in draw order


def _draws_needed(n: int, target: int) -> int:
    """Expected i.i.d. draws for ``target`` distinct values out of n (coupon collector), plus a margin."""
    if target <= 0:
        return 0
    expect = -n * math.log1p(-min(target, n - 1) / n)
    return int(expect + 4 * math.sqrt(expect) + 16)


def random_order(n: int, k: int, seed: int, step: int, key_hash: int, device: torch.device) -> Tensor:
    """First k entries of the shared random order of ``[0, n)`` (int64); prefixes are nested across k.

    The device path sorts ``[0, n)`` by counter-based 64-bit keys of the shared stream instead: the same
    distribution (a uniformly random order, so every prefix is a uniform k-subset), nested prefixes, and no host
    read of how many draws were distinct (one sort of n keys per tensor and step; the result is cached)."""
    k = min(k, n)
    if not host_kernels(device):
        keys = splitmix_block(mix_seed(seed, step, key_hash, STREAM_RANDOMK), 0, n, device)
        return torch.argsort(keys, stable=True)[:k]
    target = n // 2 if k > n // 2 else k
    gen = generator(device, seed, step, key_hash, STREAM_RANDOMK)
    blocks: list[Tensor] = []
    drawn, size = 0, FIRST_BLOCK
    head = torch.empty(0, dtype=torch.long, device=device)
    want = _draws_needed(n, target)
    while head.numel() < target:
        while drawn < want or not blocks:
            blocks.append(torch.randint(n, (size,), generator=gen, device=device))
            drawn += size
            size = int(size * BLOCK_GROWTH)
        head = _first_distinct(torch.cat(blocks) if len(blocks) > 1 else blocks[0], n)
        want = drawn + 1                      # rare: the margin was short, draw one more block
    head = head[:target]
    if k <= target:
        return head[:k]
    taken = torch.zeros(n, dtype=torch.bool, device=device)
    taken[head] = True
    rest = sel.flatnonzero(~taken).to(device)
    tail_gen = generator(device, seed, step, key_hash, STREAM_RANDOMK_TAIL)
    tail = rest.index_select(0, torch.randperm(rest.numel(), generator=tail_gen, device=device))
    return torch.cat([head, tail[:k - target]])


class RandomKParams(CompressorParams):
    value_dtype: Literal["fp32"] = "fp32"   # the payload is all-reduced as float32 words
    rescale: bool = False


class RandomK(Compressor):
    """Values of a shared random k-subset; ``rescale`` multiplies by n/k (unbiased, meant for EF off)."""

    name = "randomk"
    Params = RandomKParams
    kind = Kind.SUMMABLE
    multilevel = Multilevel.DISTRIBUTION
    shared_indices = True
    gain_kind = GainKind.PROJECTION

    def __init__(self, params: Optional[RandomKParams] = None) -> None:
        super().__init__(params)
        if self.params.rescale:
            self.gain_kind = GainKind.UNBIASED   # E[δ] = θ when rescaled
        self._hashes: dict[str, int] = {}
        self._cache: dict[str, tuple[tuple[int, int, int], Tensor]] = {}
        self._warned = False

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        k = k_for(level, numel)
        return TensorPlan(numel, level, k, (Section("val", torch.float32, k),), values_sent=k)

    def indices(self, numel: int, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        """The shared index set S (int64, length k, in the shared random order); cached per (key, step)."""
        device = ctx.param.device if ctx.param is not None else torch.device("cpu")
        tag = (ctx.seed, ctx.step, numel)
        hit = self._cache.get(ctx.key)
        if hit is not None and hit[0] == tag and hit[1].numel() >= plan.k:
            return hit[1][:plan.k]
        h = self._hashes.get(ctx.key)
        if h is None:
            h = self._hashes[ctx.key] = stable_hash(ctx.key)
        order = random_order(numel, plan.k, ctx.seed, ctx.step, h, device)
        self._cache[ctx.key] = (tag, order)
        return order

    def _encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx) -> Tensor:
        x = x.reshape(-1)
        idx = self.indices(x.numel(), plan, ctx).to(x.device)
        val = out["val"]
        if x.dtype == val.dtype:
            torch.index_select(x, 0, idx, out=val)
        else:
            val.copy_(x.index_select(0, idx))
        if self.params.rescale:
            val.mul_(x.numel() / plan.k)
        return torch.tensor(plan.k)

    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        if self.params.rescale and ctx.error_feedback and not self._warned:
            self._warned = True
            warnings.warn("ds_gravac: randomk with rescale=true and error feedback on; rescale is meant for "
                          "error-feedback-off runs", stacklevel=2)
        m = self._encode(x, plan, out, ctx)
        if update_state:
            self.memory.commit(x.reshape(-1), out, ctx)
        return m

    def compress_from(self, p1: Payload, x: Tensor, plan2: TensorPlan, out: Payload,
                      ctx: CompressCtx) -> Optional[Tensor]:
        """Stage 2: the first k2 of stage 1's shared order — a uniform k2-subset of S (see module doc)."""
        k2 = k_for(plan2.level, plan2.numel)
        assert k2 <= p1.plan.k, f"ds_gravac: multi-level needs k2 <= k1 (k2={k2}, k1={p1.plan.k})"
        return self._encode(x, plan2, out, ctx)

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        if ctx is None:
            raise ValueError("ds_gravac: randomk.decompress needs ctx (indices are regenerated, not sent)")
        if not accumulate:
            out.zero_()
        idx = self.indices(p.plan.numel, p.plan, ctx).to(out.device)
        val = p["val"]
        out.index_add_(0, idx, val if val.dtype == out.dtype else val.to(out.dtype), alpha=scale)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        return p["val"].double().square().sum()
