"""Sparsifiers with an ``(idx, val)`` payload (compressors.md §3): topk, redsync, sidco, threshold, graddrop.

``dgc`` lives in ``sparse_dgc.py`` and ``randomk`` in ``sparse_random.py``; both are imported (and so
registered) at the end of this module, which is the one the registry loads.

Payload convention: ``idx: int32[k]``, ``val: fp32|fp16[k]``; the ``m ≤ k`` real entries come first with
strictly increasing indices, padding ``(0, 0)`` after, so ``out.index_add_(0, idx, scale·val)`` decodes and
the real count can be recovered from the payload alone (``sparse_select.real_count``).
"""
from __future__ import annotations

import math
import warnings
from typing import Literal, Optional

import torch
from pydantic import Field, field_validator

from . import sparse_select as sel
from .base import (CompressCtx, Compressor, CompressorParams, Kind, Payload, Section, TensorPlan, k_for,
                   mix_seed, stable_hash)
from .registry import register_compressor

Tensor = torch.Tensor

# Stream ids of the dedicated generators (compressors.md §1 rule 4); rank-local unless noted.
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
    multilevel = "approx"
    gain_kind = "projection"
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
        """Fixed capacity (§3.1): keep the k largest |x| among the candidates, or all of them if fewer."""
        self.last_candidates[key] = cand.numel()
        return cand if cand.numel() <= k else sel.gather(cand, sel.topk_among(sel.gather(x, cand).abs(), k))

    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        x = x.detach().reshape(-1)
        idx, vals = self.select_entries(x, plan, ctx)
        m = sel.write_entries(out["idx"], out["val"], idx, sel.gather(x, idx) if vals is None else vals)
        if update_state:
            self.commit(x, out, ctx)
        return torch.tensor(m)

    # ---- multi-level (§7) --------------------------------------------------------------------------
    def compress_from(self, p1: Payload, x: Tensor, plan2: TensorPlan, out: Payload,
                      ctx: CompressCtx) -> Optional[Tensor]:
        k2 = k_for(plan2.level, plan2.numel)
        assert k2 <= p1.plan.k, f"ds_gravac: multi-level needs k2 <= k1 (k2={k2}, k1={p1.plan.k})"
        m1 = sel.real_count(p1["idx"], p1["val"])
        idx1, val1 = p1["idx"][:m1], p1["val"][:m1]
        pos = self.select_stage2(sel.abs_float(val1), k2, plan2, x, ctx) if m1 > k2 else \
            torch.arange(m1, device=val1.device)
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


# ---------------------------------------------------------------------------------------------------------
class TopKParams(SparseParams):
    algorithm: Literal["auto", "topk", "kthvalue", "sort"] = "auto"


@register_compressor("topk")
class TopK(SparseCompressor):
    """Exact top-k of |x| (§3.2). ``auto``: sampled low threshold, one candidate pass, exact selection."""

    Params = TopKParams
    multilevel = "exact"

    def select_entries(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> tuple[Tensor, Optional[Tensor]]:
        n, k, alg = x.numel(), plan.k, self.params.algorithm
        if alg == "auto":
            big = n >= sel.SMALL_N and k <= n // 4
            return sel.exact_topk(x, k, self.rank_generator(x, ctx, STREAM_TOPK_SAMPLE) if big else None)
        if k >= n:
            return torch.arange(n, device=x.device), None
        fn = {"topk": sel.topk_torch, "kthvalue": sel.topk_kthvalue, "sort": sel.topk_sort}[alg]
        return fn(x.abs(), k), None


# ---------------------------------------------------------------------------------------------------------
class RedSyncParams(SparseParams):
    search_eps: float = Field(0.2, gt=0.0, le=1.0)
    max_iters: int = Field(20, ge=1)


@register_compressor("redsync")
class RedSync(SparseCompressor):
    """Binary search of the threshold between mean and max |x| (§3.5); deterministic, no randomness."""

    Params = RedSyncParams

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        if level < 4 and not getattr(self, "_warned_low_cf", False):
            self._warned_low_cf = True
            warnings.warn(f"ds_gravac: redsync at CF {level:g} < 4 pads most payloads (its search never goes "
                          "below the mean magnitude)", stacklevel=3)
        return super().make_plan(numel, level)

    def _search(self, a: Tensor, k: int) -> Tensor:
        thr, _, _ = sel.redsync_threshold(a, k, self.params.search_eps, self.params.max_iters)
        return sel.candidates(a, thr, strict=True)

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        return self.capacity(x, self._search(x.abs(), plan.k), plan.k, ctx.key)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        return trim(a1, self._search(a1, k2), k2)


# ---------------------------------------------------------------------------------------------------------
class SIDCoParams(SparseParams):
    first_ratio: float = Field(0.25, gt=0.0, lt=1.0)
    stage_ratio: float = Field(0.25, gt=0.0, lt=1.0)
    num_stages: int = Field(0, ge=0)
    distribution: Literal["exp"] = "exp"
    adapt_stages: bool = False

    @field_validator("adapt_stages")
    @classmethod
    def _no_adapt(cls, v: bool) -> bool:
        if v:
            raise ValueError("adapt_stages is not implemented (the fixed capacity already bounds the deviation)")
        return v


@register_compressor("sidco")
class SIDCo(SparseCompressor):
    """Multi-stage exponential fit of the magnitudes (§3.6); thresholds on |x| (the ‖x‖ scaling cancels)."""

    Params = SIDCoParams

    def ratios(self, level: float) -> list[float]:
        p = self.params
        return sel.sidco_ratios(min(1.0, 1.0 / level), p.first_ratio, p.stage_ratio, p.num_stages)

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        a = x.abs()
        thr = sel.sidco_threshold(a, self.ratios(plan.level), plan.k)
        return self.capacity(x, sel.candidates(a, thr, strict=True), plan.k, ctx.key)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        q = k2 / a1.numel()   # further stages on stage 1's exceedances, product of ratios = k2/m1
        stages = max(1, math.ceil(math.log(q) / math.log(self.params.stage_ratio) - 1e-12))
        ratios = [self.params.stage_ratio] * (stages - 1) + [q / self.params.stage_ratio ** (stages - 1)]
        return trim(a1, sel.candidates(a1, sel.sidco_threshold(a1, ratios, k2, m0_first=None), strict=True), k2)


# ---------------------------------------------------------------------------------------------------------
class ThresholdParams(SparseParams):
    tau: float = Field(0.01, ge=0.0)


@register_compressor("threshold")
class Threshold(SparseCompressor):
    """Fixed magnitude threshold τ (§3.7); θ only bounds the payload, so it is a static-mode compressor."""

    Params = ThresholdParams
    static_only = True   # not usable with mode "gravac": its level does not steer the selection

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        cand = sel.candidates(x, self.params.tau, strict=True)
        return self.capacity(x, cand, plan.k, ctx.key)


# ---------------------------------------------------------------------------------------------------------
class GradDropParams(SparseParams):
    sample_ratio: float = Field(0.001, gt=0.0, le=1.0)


@register_compressor("graddrop")
class GradDrop(SparseCompressor):
    """Sampled drop threshold, no adaptation, no momentum correction (§3.7)."""

    Params = GradDropParams

    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        n = x.numel()
        s = max(1, math.ceil(self.params.sample_ratio * n))
        r = min(s, max(1, math.ceil(s / plan.level)))
        thr = sel.largest_at(sel.sample_abs(x, s, self.rank_generator(x, ctx, STREAM_GRADDROP_SAMPLE)), r)
        cand = sel.candidates(x, thr)
        return self.capacity(x, cand, plan.k, ctx.key)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        return self.sampled_stage2(a1, k2, self.params.sample_ratio, x, ctx)


from . import sparse_dgc, sparse_random  # noqa: E402,F401  (registers dgc and randomk)
