"""``dgc``: Deep Gradient Compression with momentum correction and factor masking.

DGC keeps its own memory (per-rank ``u`` momentum and ``v`` velocity, fp32, held in the synchronizer's memory
slots) and absorbs the optimizer's momentum and weight decay, so the synchronizer runs the optimizer as plain SGD
and never applies the generic error-feedback residual here.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from pydantic import Field

from ..errors import GravacConfigError
from . import sparse_select as sel
from . import sparse_thresholds as thresholds
from .base import CompressCtx, Payload, TensorPlan
from .local_clipping import clip_factor, local_limit
from .memory import CompressorMemory
from .optimizers import find_optimizer, optimizer_chain
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
    # false (default): a dense step clears u and v (DGC's rule: everything was sent). true: a dense step is a
    # heavy-ball momentum step — v is cleared, u keeps m·u + g (+ wd·w) whatever momentum_masking says — so dense
    # steps (GraVAC's dense fallback, warm-up) train as dense momentum SGD instead of restarting the momentum.
    # Masking exists to stop sent entries from being re-sent through u; after a dense send there is nothing
    # left in v to re-send, so clearing u would only turn the fallback into momentum-free SGD.
    dense_keeps_momentum: bool = False


class DGCMemory(CompressorMemory):
    """DGC's memory: per-rank momentum ``u`` and velocity ``v`` (fp32, in the synchronizer's slots); ``v`` is the
    input. Momentum correction: ``x = v + (m·u + g)``; after a send, the sent entries of ``v`` (and, with momentum
    masking, of ``u``) are cleared."""

    slots = ("u", "v")
    input_slot = "v"
    comp: DGC

    def _momentum_input(self, g: Tensor, ctx: CompressCtx) -> tuple[Tensor, float]:
        """The gradient that enters the momentum (clipped, with weight decay folded in when clipping)."""
        p = self.comp.params
        wd = ctx.weight_decay if p.local_weight_decay and ctx.param is not None else 0.0
        if p.clip_norm > 0:
            g = g if wd == 0 else g.add(ctx.param.detach().reshape(-1).to(g.dtype), alpha=wd)
            wd = 0.0
            factor = clip_factor(float(g.norm()), local_limit(p.clip_norm, ctx.world_size))
            if factor != 1.0:
                g = g * factor
        return g, wd

    def _new_momentum(self, g: Tensor, ctx: CompressCtx, out: Tensor) -> None:
        """``out ← m·u + g (+ wd·w)``: the same ops when staging (into the scratch) and committing (into u), so
        the committed momentum is bitwise the one the sent velocity was built from."""
        g, wd = self._momentum_input(g.reshape(-1), ctx)
        torch.mul(ctx.memory["u"], self.comp.params.momentum, out=out)
        out.add_(g)
        if wd:
            out.add_(ctx.param.detach().reshape(-1).to(out.dtype), alpha=wd)

    def compensate(self, g: Tensor, out: Tensor, ctx: CompressCtx) -> None:
        """Velocity ``v + (m·u + g)`` into ``out``; u and v stay as they are until the step is committed."""
        self._new_momentum(g, ctx, out)
        out.add_(ctx.memory["v"])

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """``x`` becomes the new velocity: clear the real selected indices (padding never masks index 0)."""
        x.index_fill_(0, _sent_indices(p), 0.0)

    def commit_memory(self, g: Tensor, p: Payload, ctx: CompressCtx) -> None:
        u = ctx.memory["u"]
        self._new_momentum(g, ctx, u)
        if self.comp.params.momentum_masking:
            u.index_fill_(0, _sent_indices(p), 0.0)

    def dense_sent(self, g: Tensor, ctx: CompressCtx) -> None:
        """Default: a dense send transmitted everything, u and v restart. ``dense_keeps_momentum``: a heavy-ball
        step — v is cleared and u keeps its update, with or without momentum masking."""
        if not self.comp.params.dense_keeps_momentum:
            self.reset(ctx)
            return
        ctx.memory["v"].zero_()
        self._new_momentum(g, ctx, ctx.memory["u"])


class DGC(SparseCompressor):
    """Momentum-corrected sparsification with a sampled, adapted threshold and fixed capacity."""

    name = "dgc"
    Params = DGCParams
    owns_state = True
    owns_optimizer = True   # momentum and weight decay move into the compressor (the optimizer runs plain SGD)
    clips_locally = True    # and the engine's gradient clipping, per rank before the momentum (clip_norm)
    Memory = DGCMemory

    def __init__(self, params: Optional[DGCParams] = None) -> None:
        super().__init__(params)
        self.last_adapt_iters: dict[str, int] = {}

    # ---- attach-time checks and schedule -----------------------------------------------------------
    @property
    def applies_weight_decay(self) -> bool:
        return self.params.local_weight_decay

    @property
    def clip_norm(self) -> float:
        return float(self.params.clip_norm)

    def take_clipping(self, clip: float) -> None:
        if self.params.clip_norm == 0.0:
            self.params = self.params.model_copy(update={"clip_norm": clip})

    def check_engine(self, engine: Any) -> None:
        m = self.params.momentum
        sgd = find_optimizer(engine, torch.optim.SGD)
        if sgd is None:
            chain = optimizer_chain(engine)
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
        thr, _, used = thresholds.dgc_threshold(a, k, sample, p.adapt_up, p.adapt_down, p.max_adapt_iters)
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
            self.memory.commit(x, out, ctx)
        return torch.tensor(m)

    def select_stage2(self, a1: Tensor, k2: int, plan2: TensorPlan, x: Tensor, ctx: CompressCtx) -> Tensor:
        if a1.numel() < self.params.exact_below:
            return sel.topk_among(a1, k2)
        return self.sampled_stage2(a1, k2, self.params.sample_ratio, x, ctx)


def _sent_indices(p: Payload) -> Tensor:
    """The real (non-padding) indices of a sparse payload."""
    return p["idx"][:sel.real_count(p["idx"], p["val"])].long()
