"""``powersgd``: rank-r power iteration with error feedback and warm start [Vogels et al., NeurIPS 2019].

Per compressed matrix ``M`` (viewed ``n × m``) and step, in two dependent all-reduces of one bucket::

    X = M + E;  Qh = orth(Q_prev)                    (warm start; orth is scale-invariant)
    round 1:  P_w = X·Qh             → P = Σ_w P_w   (plain matrices ride along as values)
    round 2:  Ph = orth(P);  Q_w = Xᵀ·Ph  → Q = Σ_w Q_w
    G = Ph·(Q/N)ᵀ;  E ← X − G;  Q_prev ← Q/N

The two rounds run on their own channels through the two-round exchange (``ds_gravac.sync.exchange.two_round``),
which calls :meth:`next_round` between them and :meth:`decompress_rounds` after the second. ``E`` is known only
once ``G`` is, so it is written in :meth:`commit_aggregate`, after the ranks agreed the step was finite.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .base import CompressCtx, Payload, Section, TensorPlan
from .lowrank import seeded_factor
from .kinds import REPROJECT
from .lowrank_base import F32, LowRankCompressor, LowRankMemory, LowRankParams

Tensor = torch.Tensor


class PowerSGDParams(LowRankParams):
    warm_start: bool = True


class PowerSGDMemory(LowRankMemory):
    """PowerSGD's error ``E ← X − G``, known only once the aggregate is (written in :meth:`commit_aggregate`)."""

    comp: PowerSGD

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """Nothing yet: PowerSGD's error needs the aggregate (see :meth:`commit_aggregate`)."""

    def commit_aggregate(self, x: Tensor, g: Tensor, payloads: Sequence[Payload], ctx: CompressCtx) -> None:
        """Finite step, sent compressed: ``E ← X − G`` and ``Q_prev ← Q/N``; plain matrices keep no error. Sent
        dense (no payloads), or plain at :data:`REPROJECT`: the warm start follows the exact average
        (:meth:`refresh`)."""
        if not payloads:
            if self.comp.params.warm_start and self.comp.measuring:
                self.comp.refresh(ctx, g, "q")
            return
        p1 = payloads[0]
        if "plain" in p1 or not self.comp.uses_error(ctx):
            x.zero_()
            if "plain" in p1 and p1.plan.level >= REPROJECT and self.comp.params.warm_start:
                self.comp.refresh(ctx, g, "q")
        else:
            x.sub_(g)
        qt = self.comp._step_q.pop(ctx.key, None)
        if qt is not None:
            self.comp.record_energies(ctx, qt)        # G = Ph·Qᵀ with orthonormal Ph: ‖G‖² = Σ_k ‖q_k‖²
        if qt is not None and self.comp.params.warm_start:
            n, m, r = self.comp.dims(p1.plan)
            self.comp.factor(ctx, "q", m, self.comp.width(n, m))
            self.comp.adopt(ctx, "q", qt, r)
        self.comp._step_ph.pop(ctx.key, None)


class PowerSGD(LowRankCompressor):
    name = "powersgd"
    Params = PowerSGDParams
    rounds = 2
    exchange = "two_round"
    Memory = PowerSGDMemory

    def __init__(self, params: Optional[PowerSGDParams] = None) -> None:
        super().__init__(params)
        self._step_ph: dict[str, Tensor] = {}     # this step's orth(P), between the rounds
        self._step_q: dict[str, Tensor] = {}      # this step's averaged Q, adopted at the commit

    def factor_plan(self, n: int, m: int, r: int, level: float) -> TensorPlan:
        q_plan = TensorPlan(m * r, level, r, (Section("q", F32, m * r),), 0)          # Qᵀ_w, r × m
        return TensorPlan(n * m, level, r, (Section("p", F32, n * r),), (n + m) * r,     # Pᵀ_w, r × n
                          extra=(("shape", (n, m)), ("rank", r), ("round2", q_plan)))

    def _qht(self, ctx: CompressCtx, m: int, width: int, rows: Optional[int] = None) -> Tensor:
        """``orth(Q_prev)ᵀ`` (its leading ``rows`` of ``width`` rows × m): the warm start, or a fresh seeded draw
        every step without it."""
        if self.params.warm_start:
            return self.basis(ctx, "q", m, width, rows)
        fresh = seeded_factor(ctx.seed, f"{ctx.key}:q:step{ctx.step}", m, width,
                              device=ctx.param.device if ctx.param is not None else "cpu")
        return self.orth_rows(fresh.t())

    # ---- round 1 -----------------------------------------------------------------------------------------
    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        """Round 1: ``Pᵀ_w = Qhᵀ·Xᵀ`` (r × n) into the payload; plain matrices: their values."""
        if "plain" in out:
            out["plain"].copy_(x)
            return None
        n, m, r = self.dims(plan)
        qht = self._qht(ctx, m, self.width(n, m), r)
        torch.mm(qht[:r], x.view(n, m).t(), out=out["p"].view(r, n))
        return None

    def compress_from(self, p1: Payload, x: Tensor, plan2: TensorPlan, out: Payload,
                      ctx: CompressCtx) -> Optional[Tensor]:
        """A lower rank is the leading rows of a higher rank's ``Pᵀ_w`` (same orthonormal basis)."""
        if "p" in p1 and "p" in out and p1.plan.k >= plan2.k:
            self.prefix(p1["p"], out["p"])
            return None
        return self.compress(x, plan2, out, ctx, update_state=False)

    # ---- round 2 and the result -----------------------------------------------------------------------------
    def next_round(self, x: Tensor, p1: Payload, p2: Payload, ctx: CompressCtx) -> None:
        """``Qᵀ_w = Phᵀ·X`` from round 1's reduced ``P`` (plain matrices have no second round)."""
        if "p" not in p1:
            return
        n, m, r = self.dims(p1.plan)
        pht = self.orth_rows(p1["p"].view(r, n))
        self._step_ph[ctx.key] = pht
        torch.mm(pht, x.view(n, m), out=p2["q"].view(r, m))

    def decompress_rounds(self, p1: Payload, p2: Optional[Payload], out: Tensor, scale: float,
                          ctx: CompressCtx) -> None:
        """``out = Ph·(scale·Q)ᵀ``; plain matrices: ``scale·Σ values`` (``p2`` None: no member of the bucket had a
        second round)."""
        if "plain" in p1:
            torch.mul(p1["plain"], scale, out=out)
            return
        n, m, r = self.dims(p1.plan)
        qt = p2["q"].view(r, m) * scale
        self._step_q[ctx.key] = qt
        torch.mm(self._step_ph[ctx.key].t(), qt, out=out.view(n, m))

    def decompress(self, p: Payload, out: torch.Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        raise TypeError("ds_gravac: powersgd payloads decode after two rounds (decompress_rounds)")

    def sent_payload_words(self, plan: TensorPlan) -> int:
        second = plan.get("round2")
        return plan.words + (second.words if second is not None else 0)
