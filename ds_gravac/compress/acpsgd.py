"""``acpsgd``: alternating compressed power iteration [Zhang et al., "Evaluation and Optimization of Gradient
Compression for Distributed Deep Learning", ICDCS 2023].

Each step computes *one* factor from the local gradient and the factor the ranks shared on the previous step, so a
step has a single all-reduce per bucket that can start in the gradient hook, and the local error is known before
it::

    P-step:  Qh = orth(Q_prev);  X = M + E;  P_w = X·Qh;   E ← X − P_w·Qhᵀ;  P = Σ_w P_w;  G = P·Qhᵀ/N;  P_prev ← P
    Q-step:  Ph = orth(P_prev);  X = M + E;  Q_w = Xᵀ·Ph;  E ← X − Ph·Q_wᵀ;  Q = Σ_w Q_w;  G = Ph·Qᵀ/N;  Q_prev ← Q

The parity (:attr:`phase`: 0 = P-step, 1 = Q-step) is replicated and checkpointed; it flips only after a finite
step that sent an ACP payload (never on dense or skipped steps, never per micro-batch). A Q-step keeps the rank
its P-step used, so a rank change (Accordion, GraVAC) takes effect at the next P-step and never splits a pair.
The first compressed step is a P-step from the shared seeded ``Q_prev``: ranks that started from different
factors would average unrelated subspaces.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from .base import CompressCtx, Payload, Section, TensorPlan
from .lowrank_base import F32, LowRankCompressor, LowRankMemory

Tensor = torch.Tensor
P_STEP, Q_STEP = 0, 1


class ACPSGDMemory(LowRankMemory):
    """ACP-SGD's local error ``X − P_w·Qhᵀ`` (or ``X − Ph·Q_wᵀ``), and the shared factor adopted after the step."""

    comp: ACPSGD

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """The local error, before any communication: ``X − P_w·Qhᵀ`` or ``X − Ph·Q_wᵀ``."""
        if "plain" in p or not self.comp.uses_error(ctx):
            x.zero_()
            return
        a, b, n, m = self.comp._outer(p, ctx)
        x.view(n, m).addmm_(a, b, alpha=-1.0)

    def commit_aggregate(self, x: Tensor, g: Tensor, payloads: Sequence[Payload], ctx: CompressCtx) -> None:
        """Finite step, sent compressed: the aggregated factor (a sum: orth is scale-invariant) is shared. Sent
        dense: the factor the next compressed step reads follows the exact average (:meth:`refresh`)."""
        if not payloads:
            if self.comp.measuring:
                self.comp.refresh(ctx, g, "q" if self.comp.phase == P_STEP else "p")
            return
        p = payloads[0]
        if p.plan.get("phase", self.comp.phase) == P_STEP:
            self.comp.p_levels[ctx.key] = float(p.plan.level)
        if "f" not in p:
            return
        n, m, r = self.comp.dims(p.plan)
        side, cols = ("p", n) if p.plan.get("phase") == P_STEP else ("q", m)
        f = p["f"].view(r, cols)
        if self.comp.wants_energies:   # G = scale·F·basis, orthonormal basis: scale from ‖G‖² = scale²·‖F‖²
            total = float(f.double().square().sum())
            if total > 0:
                g_energy = float(torch.linalg.vector_norm(g, dtype=torch.float64)) ** 2   # no float64 copy of G
                self.comp.record_energies(ctx, f, (g_energy / total) ** 0.5)
        self.comp.factor(ctx, side, cols, self.comp.width(n, m))
        self.comp.adopt(ctx, side, f, r)


class ACPSGD(LowRankCompressor):
    name = "acpsgd"
    pair_factor = 2.0        # a P/Q pair moves (n + m)·r values for two steps' gradients
    Memory = ACPSGDMemory

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.phase = P_STEP
        self.p_levels: dict[str, float] = {}      # replicated: the level each matrix used at its last P-step

    def factor_plan(self, n: int, m: int, r: int, level: float) -> TensorPlan:
        cols = n if self.phase == P_STEP else m          # the factor is sent transposed: r × n or r × m
        return TensorPlan(n * m, level, r, (Section("f", F32, cols * r),), cols * r,
                          extra=(("shape", (n, m)), ("rank", r), ("phase", self.phase)))

    def member_level(self, ctx: CompressCtx, level: float) -> float:
        """A Q-step sends at its P-step's level (the shared ``P_prev`` was built at that rank)."""
        if self.phase == Q_STEP:
            return self.p_levels.get(ctx.key, level)
        return level

    def _shared(self, ctx: CompressCtx, plan: TensorPlan) -> tuple[Tensor, int, int, int]:
        """The orthonormal shared factor of this step, transposed (``Qhᵀ``: r × m on P-steps, ``Phᵀ``: r × n on
        Q-steps)."""
        n, m, r = self.dims(plan)
        w = self.width(n, m)
        basis = self.basis(ctx, "q", m, w, r) if plan.get("phase") == P_STEP else self.basis(ctx, "p", n, w, r)
        return basis[:r], n, m, r

    # ---- encode / decode ----------------------------------------------------------------------------------
    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        """P-step: ``Pᵀ_w = Qhᵀ·Xᵀ`` (r × n); Q-step: ``Qᵀ_w = Phᵀ·X`` (r × m); plain matrices: their values."""
        if "plain" in out:
            out["plain"].copy_(x)
        else:
            shared, n, m, r = self._shared(ctx, plan)
            xm = x.view(n, m)
            if plan.get("phase") == P_STEP:
                torch.mm(shared, xm.t(), out=out["f"].view(r, n))
            else:
                torch.mm(shared, xm, out=out["f"].view(r, m))
        if update_state:
            self.memory.commit(x, out, ctx)
        return None

    def compress_from(self, p1: Payload, x: Tensor, plan2: TensorPlan, out: Payload,
                      ctx: CompressCtx) -> Optional[Tensor]:
        """A lower rank is the leading rows of a higher rank's factor (same orthonormal basis)."""
        if "f" in p1 and "f" in out and p1.plan.k >= plan2.k:
            self.prefix(p1["f"], out["f"])
            return None
        return self.compress(x, plan2, out, ctx, update_state=False)

    def _outer(self, p: Payload, ctx: CompressCtx) -> tuple[Tensor, Tensor, int, int]:
        """``(A, B)`` with ``A·B`` = the payload's rank-r matrix (n × m): ``P·Qhᵀ`` or ``Ph·Qᵀ``."""
        shared, n, m, r = self._shared(ctx, p.plan)
        if p.plan.get("phase") == P_STEP:
            return p["f"].view(r, n).t(), shared, n, m
        return shared.t(), p["f"].view(r, m), n, m

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        """``G = scale·P·Qhᵀ`` (P-step) or ``scale·Ph·Qᵀ`` (Q-step); plain matrices: ``scale·Σ values``."""
        assert ctx is not None
        if "plain" in p:
            if accumulate:
                out.add_(p["plain"], alpha=scale)
            else:
                torch.mul(p["plain"], scale, out=out)
            return
        a, b, n, m = self._outer(p, ctx)
        if accumulate:
            out.view(n, m).addmm_(a, b, alpha=scale)
        else:
            torch.mm(a, b * scale, out=out.view(n, m))

    def step_committed(self, compressed: bool) -> None:
        """The parity flips only after a finite step that sent ACP payloads."""
        if compressed:
            self.phase = Q_STEP if self.phase == P_STEP else P_STEP

    # ---- checkpoints ------------------------------------------------------------------------------------
    def replicated_extra(self) -> dict[str, Any]:
        return {"phase": int(self.phase), "p_levels": dict(self.p_levels)}

    def load_replicated_extra(self, state: dict[str, Any]) -> None:
        self.phase = int(state.get("phase", P_STEP))
        self.p_levels = {str(k): float(v) for k, v in (state.get("p_levels") or {}).items()}
