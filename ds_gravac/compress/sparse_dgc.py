"""``dgc``: Deep Gradient Compression with momentum correction and factor masking (compressors.md §3.4).

DGC owns its memory (per-rank ``u`` momentum and ``v`` velocity, fp32) and absorbs the optimizer's momentum
and weight decay, so the synchronizer runs the optimizer as plain SGD and never applies external EF here.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch
from pydantic import Field

from ..errors import GravacConfigError
from . import sparse_select as sel
from .base import CompressCtx, Payload, TensorPlan
from .registry import register_compressor
from .sparse import SparseCompressor, SparseParams, trim

Tensor = torch.Tensor
STREAM_DGC_SAMPLE = 0x6467_6373


class DGCParams(SparseParams):
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    momentum_masking: bool = True
    local_weight_decay: bool = True
    sample_ratio: float = Field(0.01, gt=0.0, le=1.0)
    adapt_up: float = Field(1.3, gt=1.0)
    adapt_down: float = Field(0.7, gt=0.0, lt=1.0)
    max_adapt_iters: int = Field(10, ge=0)
    exact_below: int = Field(16384, ge=0)
    clip_norm: float = Field(0.0, ge=0.0)
    warmup_steps: int = Field(0, ge=0)
    warmup_stages: int = Field(4, ge=1)
    # false (compressors.md rule 1): a dense step clears u and v. true: a dense step counts as a θ = 1 step — v is
    # cleared, u only under momentum_masking — so without masking, dense steps (GraVAC's fallback, warm-up) keep
    # heavy-ball momentum instead of restarting it every step.
    dense_keeps_momentum: bool = False


def _optimizer_chain(engine: Any) -> list[Any]:
    """The engine's optimizer objects, outermost first (DeepSpeed wraps the basic one under bf16/fp16)."""
    chain: list[Any] = []
    for start in (getattr(engine, "basic_optimizer", None), getattr(engine, "optimizer", None)):
        opt, depth = start, 0
        while opt is not None and depth < 4 and all(opt is not c for c in chain):
            chain.append(opt)
            opt, depth = getattr(opt, "optimizer", None), depth + 1
    return chain


@register_compressor("dgc")
class DGC(SparseCompressor):
    """Momentum-corrected sparsification with a sampled, adapted threshold and fixed capacity."""

    Params = DGCParams
    owns_state = True
    owns_optimizer = True   # momentum and weight decay move into the compressor (synchronization.md §3)

    def __init__(self, params: Optional[DGCParams] = None) -> None:
        super().__init__(params)
        self._u: dict[str, Tensor] = {}
        self._v: dict[str, Tensor] = {}
        self.last_adapt_iters: dict[str, int] = {}

    # ---- attach-time checks and schedule -----------------------------------------------------------
    def check_engine(self, engine: Any) -> None:
        m = self.params.momentum
        chain = _optimizer_chain(engine)
        sgd = next((o for o in chain if isinstance(o, torch.optim.SGD)), None)
        if sgd is None:
            found = type(chain[0]).__name__ if chain else "none"
            raise GravacConfigError(f"ds_gravac: compressor 'dgc' needs torch.optim.SGD with momentum={m} (it "
                                    f"applies momentum itself); the engine's optimizer is {found}")
        for i, group in enumerate(sgd.param_groups):
            if group.get("nesterov", False):
                raise GravacConfigError(f"ds_gravac: compressor 'dgc' implements heavy-ball momentum; param "
                                        f"group {i} uses nesterov=True")
            if not math.isclose(float(group.get("momentum", 0.0)), m, rel_tol=0.0, abs_tol=1e-12):
                raise GravacConfigError(f"ds_gravac: compressor 'dgc' has momentum={m} but optimizer param "
                                        f"group {i} has momentum={group.get('momentum', 0.0)}; they must match")

    def effective_cf(self, theta: float, step: int) -> float:
        """DGC warm-up: densities 25%, 6.25%, ... (θ capped at 4^(j+1)) during ``warmup_steps``."""
        p = self.params
        if step < p.warmup_steps:
            stage = (step * p.warmup_stages) // p.warmup_steps
            return min(theta, float(4 ** (stage + 1)))
        return theta

    # ---- memory ------------------------------------------------------------------------------------
    def _state(self, g: Tensor, key: str) -> tuple[Tensor, Tensor]:
        u = self._u.get(key)
        if u is None or u.numel() != g.numel() or u.device != g.device:
            dtype = g.dtype if g.dtype in (torch.float32, torch.float64) else torch.float32
            u = self._u[key] = torch.zeros(g.numel(), dtype=dtype, device=g.device)
            self._v[key] = torch.zeros_like(u)
        return u, self._v[key]

    def compensate(self, g: Tensor, ctx: CompressCtx) -> Tensor:
        """Weight decay and clipping on g, then ``u ← m·u + g; v ← v + u``; returns v."""
        p = self.params
        g = g.reshape(-1)
        u, v = self._state(g, ctx.key)
        wd = ctx.weight_decay if p.local_weight_decay and ctx.param is not None else 0.0
        if p.clip_norm > 0:
            g = g.to(u.dtype) if wd == 0 else g.to(u.dtype).add(ctx.param.detach().reshape(-1), alpha=wd)
            wd = 0.0
            norm = float(g.norm())
            limit = p.clip_norm / math.sqrt(max(1, ctx.world_size))
            if norm > limit:
                g = g * (limit / norm)
        u.mul_(p.momentum).add_(g)
        if wd:
            u.add_(ctx.param.detach().reshape(-1), alpha=wd)
        return v.add_(u)

    def _mask(self, key: str, idx: Tensor) -> None:
        v = self._v.get(key)
        if v is None or idx.numel() == 0:
            return
        v.index_fill_(0, idx, 0.0)
        if self.params.momentum_masking:
            self._u[key].index_fill_(0, idx, 0.0)

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """Mask v (and u) at the real selected indices; padding never masks index 0."""
        m = sel.real_count(p["idx"], p["val"])
        self._mask(ctx.key, p["idx"][:m].long())

    def reset(self, ctx: CompressCtx) -> None:
        for store in (self._u, self._v):
            t = store.get(ctx.key)
            if t is not None:
                t.zero_()

    def dense_sent(self, ctx: CompressCtx) -> None:
        if not self.params.dense_keeps_momentum:
            self.reset(ctx)
            return
        v = self._v.get(ctx.key)
        if v is not None:
            v.zero_()
            if self.params.momentum_masking:
                self._u[ctx.key].zero_()

    def state_dict(self) -> dict[str, dict[str, Any]]:
        local = {k: {"u": self._u[k].clone(), "v": self._v[k].clone()} for k in self._u}
        return {"replicated": {}, "local": local}

    def load_state_dict(self, state: dict[str, dict[str, Any]], world_size_changed: bool = False) -> None:
        self._u.clear()
        self._v.clear()
        local = state.get("local", {})
        if world_size_changed:
            if local:
                warnings.warn("ds_gravac: dgc: world size changed, momentum/velocity memory reset to zero",
                              stacklevel=2)
            return
        for key, tensors in local.items():
            self._u[key] = tensors["u"].clone()
            self._v[key] = tensors["v"].clone()

    # ---- selection ---------------------------------------------------------------------------------
    def select(self, x: Tensor, plan: TensorPlan, ctx: CompressCtx) -> Tensor:
        p, n, k = self.params, x.numel(), plan.k
        if k >= n:
            return torch.arange(n, device=x.device)
        if n < p.exact_below:
            return sel.topk_among(x.abs(), k)
        a = x.abs()
        s = max(1, math.ceil(p.sample_ratio * n))
        if s >= n:   # sampling everything: the exact k-th value, no replacement noise
            sample = a
        else:
            gen = self.rank_generator(x, ctx, STREAM_DGC_SAMPLE)
            sample = a.index_select(0, torch.randint(n, (s,), generator=gen, device=x.device))
        thr, _, used = sel.dgc_threshold(a, k, sample, p.adapt_up, p.adapt_down, p.max_adapt_iters)
        self.last_adapt_iters[ctx.key] = used
        cand = sel.candidates(a, thr)
        self.last_candidates[ctx.key] = cand.numel()
        return trim(a, cand, k)

    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        x = x.detach().reshape(-1)
        idx = self.select(x, plan, ctx)
        m = sel.write_entries(out["idx"], out["val"], idx, sel.gather(x, idx))
        if update_state:
            self._mask(ctx.key, idx)
        return torch.tensor(m)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        if a1.numel() < self.params.exact_below:
            return sel.topk_among(a1, k2)
        return self.sampled_stage2(a1, k2, self.params.sample_ratio, x, ctx)
