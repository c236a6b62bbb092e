"""The shared base of the sparsifiers with an ``(idx, val)`` payload (topk, dgc, redsync, sidco, threshold,
graddrop; one module each): plan, encode, multi-level second stage, decode.

Payload convention: ``idx: int32[k]``, ``val: fp32|fp16[k]``; the ``m ≤ k`` real entries come first with
strictly increasing indices, padding ``(0, 0)`` after, so ``out.index_add_(0, idx, scale·val)`` decodes and
the real count can be recovered from the payload alone (``sparse_select.real_count``).
"""
from __future__ import annotations

import math
from typing import Literal, Optional

import torch

from . import sparse_select as sel
from .base import (CompressCtx, Compressor, CompressorParams, Kind, Payload, Section, TensorPlan, k_for,
                   mix_seed, stable_hash)
from .kinds import GainKind, Multilevel

Tensor = torch.Tensor

# Stream ids of the dedicated generators (every random draw has its own seeded stream); rank-local unless noted.
STREAM_TOPK_SAMPLE = 0x7470_6B31
STREAM_STAGE2_SAMPLE = 0x7374_6732
STREAM_GRADDROP_SAMPLE = 0x6764_7270

VALUE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


class SparseParams(CompressorParams):
    """Parameters common to every ``(idx, val)`` sparsifier."""

    value_dtype: Literal["fp32", "fp16"] = "fp32"


class SparseCompressor(Compressor):
    """Shared plan/encode/decode of the ``(idx, val)`` payload; subclasses implement :meth:`select`."""

    kind = Kind.SPARSE
    multilevel = Multilevel.APPROX
    gain_kind = GainKind.PROJECTION
    Params = SparseParams

    def __init__(self, params: Optional[CompressorParams] = None) -> None:
        super().__init__(params)
        self._hashes: dict[str, int] = {}
        self._gens: dict[tuple[str, int], torch.Generator] = {}
        self.last_candidates: dict[str, int] = {}   # pre-trim candidate count per key (threshold selectors)

    # ---- layout ------------------------------------------------------------------------------------
    @property
    def value_dtype(self) -> torch.dtype:
        return VALUE_DTYPES[self.params.value_dtype]

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        k = k_for(level, numel)
        sections = (Section("idx", torch.int32, k), Section("val", self.value_dtype, k))
        return TensorPlan(numel, level, k, sections, values_sent=k)

    # ---- randomness --------------------------------------------------------------------------------
    def key_hash(self, key: str) -> int:
        h = self._hashes.get(key)
        if h is None:
            h = self._hashes[key] = stable_hash(key)
        return h

    def rank_generator(self, x: Tensor, ctx: CompressCtx, stream: int) -> torch.Generator:
        """Rank-local stream (threshold sampling): differs per rank, reproducible per (seed, step, key).

        One generator object per (device, stream) is re-seeded per call (construction costs ~10 µs);
        callers use it immediately and never hold it across another request for the same stream.
        """
        slot = (str(x.device), stream)
        gen = self._gens.get(slot)
        if gen is None:
            gen = self._gens[slot] = torch.Generator(device=x.device)
        gen.manual_seed(mix_seed(ctx.seed, ctx.step, self.key_hash(ctx.key), stream, ctx.rank))
        return gen

    # ---- encode ------------------------------------------------------------------------------------
    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        """Sorted int64 indices of the ≤ k real entries to send."""
        raise NotImplementedError

    def select_entries(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> tuple[Tensor, Optional[Tensor]]:
        """(indices, values or None); selectors that already hold the values skip a second gather."""
        return self.select(x, plan, ctx), None

    def capacity(self, x: Tensor, cand: Tensor, k: int, key: str) -> Tensor:
        """Fixed capacity: keep the k largest |x| among the candidates, or all of them if fewer."""
        self.last_candidates[key] = cand.numel()
        return cand if cand.numel() <= k else sel.gather(cand, sel.topk_among(sel.gather(x, cand).abs(), k))

    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        x = x.detach().reshape(-1)
        idx, vals = self.select_entries(x, plan, ctx)
        m = sel.write_entries(out["idx"], out["val"], idx, sel.gather(x, idx) if vals is None else vals)
        if update_state:
            self.memory.commit(x, out, ctx)
        return torch.tensor(m)

    # ---- multi-level --------------------------------------------------------------------------
    def compress_from(self, p1: Payload, x: Tensor, plan2: TensorPlan, out: Payload,
                      ctx: CompressCtx) -> Optional[Tensor]:
        k2 = k_for(plan2.level, plan2.numel)
        assert k2 <= p1.plan.k, f"ds_gravac: multi-level needs k2 <= k1 (k2={k2}, k1={p1.plan.k})"
        m1 = sel.real_count(p1["idx"], p1["val"])
        idx1, val1 = p1["idx"][:m1], p1["val"][:m1]
        pos = (self.select_stage2(sel.abs_float(val1), k2, plan2, x, ctx) if m1 > k2 else
            torch.arange(m1, device=val1.device))
        m = sel.write_gathered(out["idx"], out["val"], idx1, val1, pos)
        return torch.tensor(m)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        """Sorted positions (≤ k2) among stage 1's real magnitudes ``a1``; default exact top-k2."""
        return sel.topk_among(a1, k2)

    def sampled_stage2(self, a1: Tensor, k2: int, ratio: float, x: Tensor, ctx: CompressCtx) -> Tensor:
        """Approx stage 2 of DGC/GradDrop: threshold from a sample of stage 1's values, then capacity k2."""
        m1 = a1.numel()
        s = max(1, math.ceil(ratio * m1))
        gen = self.rank_generator(x, ctx, STREAM_STAGE2_SAMPLE)
        thr = sel.largest_at(sel.sample_abs(a1, s, gen), max(1, math.ceil(s * k2 / m1)))
        return trim(a1, sel.candidates(a1, thr), k2)

    # ---- decode ------------------------------------------------------------------------------------
    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        if not accumulate:
            out.zero_()
        val = p["val"]
        out.index_add_(0, p["idx"], val if val.dtype == out.dtype else val.to(out.dtype), alpha=scale)

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        return p["val"].double().square().sum()


def trim(a: Tensor, cand: Tensor, k: int) -> Tensor:
    """Fixed capacity on positions: the canonical top-k of ``a`` among ``cand`` (all of them if ≤ k)."""
    return cand if cand.numel() <= k else sel.gather(cand, sel.topk_among(sel.gather(a, cand), k))
