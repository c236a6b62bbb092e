"""What PowerSGD and ACP-SGD share as compressors: parameters, levels (ranks or CFs), per-matrix plans, the
replicated factor store, and their error memory.

**Levels.** In ``static`` and ``accordion`` modes a level is a rank. Under ``mode: "gravac"`` the controller works
in compression factors; a level θ then maps to a rank per matrix: the largest ``r`` whose CF is still ≥ θ, at
least 1 (:meth:`LowRankCompressor.rank_for`). A matrix is sent as factors only when that rank passes PyTorch's
rule ``(n + m)·r·min_compression_rate < n·m``; otherwise it travels *plain* in the same all-reduce (its values, no
error feedback). So a matrix stops compressing when θ drops to about ``min_compression_rate`` (where the rank
that reaches θ no longer pays), and it never compresses beyond its rank-1 CF however large θ is.

With ``"rank_ladder": "uniform"`` GraVAC's levels are instead the rungs of a uniform rank ladder (64, 32, …, 1;
level ``128 / r``, :func:`~ds_gravac.compress.lowrank.uniform_levels`): every matrix gets the rung's rank, capped
at the largest rank that pays (plain when none does). The *pinned* matrices (the classifier, found at attach:
:meth:`LowRankCompressor.pin`) get at least ``rank`` (the static rank, 16 by default) and travel plain when that
rank does not pay, so a coarse rung never squeezes the classifier.

**Factors.** Each matrix keeps replicated factors with ``width`` columns, the largest rank the run can ask for
(static: ``rank``; Accordion: its larger rank; GraVAC: the rank at ``theta_min``). A step at a lower rank uses
the leading columns of the orthonormalized factor. With QR the leading columns of ``orth(F)`` span the leading
columns of ``F``, so one projection at the largest rank measured gives every lower rank's payload and gain as a
prefix (the low-rank form of multi-level compression), and a rank change keeps the warm start instead of
re-drawing it. Factors change only in :meth:`commit_aggregate`, after the ranks agreed the step was finite.

**Error.** ``E`` lives in the synchronizer's memory slot ``"error"`` (fp32 whatever the gradient dtype):
``compensate`` forms ``X = M + E`` and the compressor decides what ``E`` becomes.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, Sequence

import torch
from pydantic import Field

from .base import CompressCtx, Compressor, CompressorParams, Kind, Payload, Section, TensorPlan
from .kinds import GainKind, LevelKind, Multilevel
from .memory import CompressorMemory
from .lowrank import matrix_rank, matrix_shape, orthogonalize, seeded_factor, uniform_levels, uniform_rank

Tensor = torch.Tensor
F32 = torch.float32


class LowRankParams(CompressorParams):
    # 16: the rank that learned closest to dense per step on the tasks measured (docs/BENCHMARKS_HISTORY.md §3.5);
    # PyTorch's hook and the PowerSGD paper use 1-4, which lagged far behind here
    rank: int = Field(16, ge=1, le=1024)
    min_compression_rate: float = Field(2.0, ge=1.0)
    error_feedback: bool = True
    orthogonalize: Literal["qr", "gram_schmidt"] = "qr"
    orth_eps: float = Field(1e-8, gt=0.0, le=1e-2)
    # a dense step (warm-up, GraVAC's dense branch, the discovery step) advances the shared factors by one power
    # iteration on the exact average, so the warm start keeps tracking the gradient's subspace while nothing is
    # compressed (false: factors stay as they were, as PyTorch's hook does)
    dense_refresh: bool = True
    # the classifier (the last compressed matrix in registration order) at its own rank under static and
    # Accordion modes; null: the rank of every matrix. 1 is what GraVAC's CF mapping gives ResNet101's classifier
    # at θ 10, beside static rank 16 (issue 42's M1, docs/algorithms.md §7)
    classifier_rank: Optional[int] = Field(None, ge=1, le=1024)


class LowRankMemory(CompressorMemory):
    """The low-rank error ``E`` (slot ``"error"``): ``X = M + E`` (``M`` alone without error feedback); what ``E``
    becomes is the subclass's rule (PowerSGD: ``X − G`` after the aggregate; ACP-SGD: the local error)."""

    slots = ("error",)
    input_slot = "error"
    comp: LowRankCompressor

    def compensate(self, g: Tensor, out: Tensor, ctx: CompressCtx) -> None:
        if self.comp.params.error_feedback and ctx.error_feedback:
            torch.add(ctx.memory["error"], g, out=out)
        else:
            out.copy_(g)


class LowRankCompressor(Compressor):
    """Base of the low-rank compressors (see the module docstring). Subclasses define the payload sections."""

    Params = LowRankParams
    kind = Kind.SUMMABLE
    owns_state = True
    level_kind = LevelKind.RANK
    multilevel = Multilevel.NONE
    gain_kind = GainKind.PROJECTION
    Memory = LowRankMemory
    aggregate_gain = True      # reports the energy of each component of the applied aggregate (component_energies)
    pair_factor = 1.0          # CF of one full exchange is pair_factor·n·m/((n+m)·r) (ACP sends a pair)

    def __init__(self, params: Optional[LowRankParams] = None) -> None:
        super().__init__(params)
        self.bound = float(self.params.rank)
        self.ladder = "cf"                                     # "uniform": GraVAC levels are uniform-rank rungs
        # the classifier's matrix shapes: kept at >= params.rank on the uniform ladder, sent at classifier_rank
        self.pinned: frozenset[tuple[int, int]] = frozenset()
        self.factors: dict[str, dict[str, Tensor]] = {}      # replicated: key → {"q": m×W, "p": n×W}
        # orth of a stored factor's leading rows (with the factor's width), until it changes
        self._bases: dict[tuple[str, str], tuple[int, Tensor]] = {}
        self._tensor_plans: dict[tuple[Any, ...], TensorPlan] = {}
        self._energies: dict[str, Tensor] = {}                # this step's component energies, per matrix

    # ---- levels ----------------------------------------------------------------------------------------
    def bind_levels(self, kind: str, bound: float) -> None:
        """Called at attach: ``kind`` "rank" (bound = the largest rank used), "cf" (bound = θ_min, the smallest
        CF GraVAC will measure) or "uniform" (GraVAC over the uniform ladder, bound = its θ_min level). Fixes how
        levels map to ranks and how wide the factors are."""
        if kind not in ("rank", "cf", "uniform"):
            raise ValueError(f"ds_gravac: level kind {kind!r}")
        self.ladder = "uniform" if kind == "uniform" else "cf"
        kind = "cf" if kind == "uniform" else kind                # the controller sees levels on a CF grid
        self.level_kind = LevelKind(kind)                         # instance attribute: shadows the class default
        # prefixes of one projection (module docstring)
        self.multilevel = Multilevel.EXACT if kind == LevelKind.CF else Multilevel.NONE
        self.bound = float(bound)
        self._tensor_plans.clear()

    def pin(self, shapes: Sequence[Sequence[int]]) -> None:
        """The classifier's shapes (attach, before any plan is made): on the uniform ladder they keep at least
        ``rank``; at rank levels they get ``classifier_rank`` when it is set."""
        self.pinned = frozenset(matrix_shape(s) for s in shapes)
        self._tensor_plans.clear()

    def default_level(self) -> Optional[float]:
        return float(self.params.rank)

    def cf_grid(self) -> Optional[list[float]]:
        return uniform_levels() if self.ladder == "uniform" else None

    def accepts(self, shape: Sequence[int]) -> bool:
        """Matrices (2-D or more) that pay at rank 1; 1-D tensors and tiny matrices travel on the dense path."""
        if len(shape) < 2:
            return False
        n, m = matrix_shape(shape)
        return (n + m) * self.params.min_compression_rate < n * m

    def matrix_cf(self, n: int, m: int, r: int) -> float:
        return self.pair_factor * n * m / ((n + m) * r)

    def rank_for(self, n: int, m: int, level: float) -> int:
        """The rank of an ``n × m`` matrix at ``level`` (a rank, or a CF under GraVAC)."""
        if self.level_kind == LevelKind.RANK:
            fixed = self.params.classifier_rank if (n, m) in self.pinned else None
            return matrix_rank(n, m, int(round(level)) if fixed is None else fixed)
        if self.ladder == "uniform":
            return self._ladder_rank(n, m, level)
        r = math.floor(self.pair_factor * n * m / ((n + m) * float(level)) + 1e-9)
        return matrix_rank(n, m, max(1, r))

    def _ladder_rank(self, n: int, m: int, level: float) -> int:
        """The rung's rank capped at the largest paying rank; a pinned matrix at least ``rank``, else 0 (plain)."""
        cap = self.largest_paying_rank(n, m)
        r = uniform_rank(level)
        if (n, m) in self.pinned:
            floor = matrix_rank(n, m, self.params.rank)
            return min(max(r, floor), cap) if floor <= cap else 0
        return min(r, cap)

    def width(self, n: int, m: int) -> int:
        """Columns of the stored factors: the largest rank this run can send the matrix at (a rank that does not
        pay sends the matrix plain and needs no factor columns)."""
        return max(1, min(self.rank_for(n, m, self.bound), self.largest_paying_rank(n, m)))

    def largest_paying_rank(self, n: int, m: int) -> int:
        r = math.ceil(n * m / ((n + m) * self.params.min_compression_rate)) - 1
        while r > 0 and not self.pays(n, m, r):      # float rounding at the boundary
            r -= 1
        return matrix_rank(n, m, r)

    def pays(self, n: int, m: int, r: int) -> bool:
        return r > 0 and (n + m) * r * self.params.min_compression_rate < n * m

    # ---- plans -----------------------------------------------------------------------------------------
    def tensor_plan(self, shape: Sequence[int], level: float) -> TensorPlan:
        key = (tuple(int(s) for s in shape), float(level), self.phase)
        plan = self._tensor_plans.get(key)
        if plan is None:
            n, m = matrix_shape(shape)
            r = self.rank_for(n, m, level)
            if self.pays(n, m, r):      # never above the stored factors (a level beyond the bound fixed at attach)
                plan = self.factor_plan(n, m, min(r, self.width(n, m)), float(level))
            else:
                plan = self.plain_plan(n, m, level)
            self._tensor_plans[key] = plan
        return plan

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        raise TypeError(f"ds_gravac: compressor '{self.name}' plans per matrix shape (tensor_plan), not per numel")

    @staticmethod
    def plain_plan(n: int, m: int, level: float) -> TensorPlan:
        """The matrix's own values, summed with the factors (no error feedback)."""
        return TensorPlan(n * m, float(level), n * m, (Section("plain", F32, n * m),), n * m,
                          extra=(("shape", (n, m)), ("rank", 0)))

    def factor_plan(self, n: int, m: int, r: int, level: float) -> TensorPlan:
        raise NotImplementedError

    @staticmethod
    def dims(plan: TensorPlan) -> tuple[int, int, int]:
        n, m = plan.get("shape")
        return n, m, int(plan.get("rank"))

    # ---- factors (replicated) --------------------------------------------------------------------------
    # Factors and payloads are stored transposed, one row per rank-one component (``Qᵀ``: W × m, ``Pᵀ``: W × n,
    # row-major): a lower rank is a contiguous prefix of rows, and every product below is a GEMM whose small side
    # is the leading dimension (``Fᵀ·Xᵀ`` or ``Fᵀ·X``), several times faster on CPU BLAS than ``X·F`` with a
    # skinny ``F`` (measured 3-10x at r = 2 to 4 on ResNet shapes).
    def factor(self, ctx: CompressCtx, side: str, cols: int, width: int) -> Tensor:
        """The stored factor ``side`` ("p": n columns, "q": m columns) of a matrix as ``width × cols``, drawn from
        the shared seeded stream the first time (identical on every rank, independent of the global RNG)."""
        device = ctx.param.device if ctx.param is not None else torch.device("cpu")
        store = self.factors.setdefault(ctx.key, {})
        f = store.get(side)
        if f is None or tuple(f.shape) != (width, cols):
            f = store[side] = (seeded_factor(ctx.seed, f"{ctx.key}:{side}", cols, width, device=device).t()
                .contiguous())
        elif f.device != device:          # restored from a checkpoint on the CPU
            f = store[side] = f.to(device)
        return f

    def basis(self, ctx: CompressCtx, side: str, cols: int, width: int, rows: Optional[int] = None) -> Tensor:
        """The leading ``rows`` (default: all ``width``) rows of ``orth(F)ᵀ`` (orthonormal rows), cached until
        the factor changes; lower ranks use its leading rows.

        Why ``rows``: orthonormalizing the leading ``r`` columns of ``F`` gives the leading ``r`` columns of
        ``orth(F)`` (QR and Gram–Schmidt treat columns in order), and a step sending rank ``r`` reads no more. Under
        ``auto`` the factors are 64 wide while most steps send rank 16: a full-width QR of every ``Q`` each step
        took half of the compress time (ResNet-18: 0.069 against static rank 16's 0.034 s a step)."""
        rows = width if rows is None else max(1, min(int(rows), width))
        if self._stale_basis(ctx.key, side, (width, cols), rows):
            self.factor(ctx, side, cols, width)
            self._orthogonalize_group(side, (width, cols), ctx.key, rows)
        return self._bases[(ctx.key, side)][1]

    def _stale_basis(self, key: str, side: str, shape: tuple[int, int], rows: int) -> bool:
        """No cached basis of a factor of ``shape`` (width × cols) with at least ``rows`` rows."""
        cached = self._bases.get((key, side))
        return cached is None or cached[0] != shape[0] or cached[1].shape[1] != shape[1] or cached[1].shape[0] < rows

    def _orthogonalize_group(self, side: str, shape: tuple[int, int], key: str, rows: int) -> None:
        """Orthonormalize, in one batched call, the leading ``rows`` rows of every stored ``side`` factor of this
        shape whose basis is stale or shorter (same-shape matrices are common: a ResNet's blocks repeat their
        convolutions)."""
        keys = [k for k, f in self.factors.items()
                if side in f and tuple(f[side].shape) == shape and self._stale_basis(k, side, shape, rows)]
        keys = keys if key in keys else keys + [key]
        stacked = torch.stack([self.factors[k][side][:rows].t() for k in keys])      # batch × cols × rows
        bases = orthogonalize(stacked, self.params.orthogonalize, self.params.orth_eps).transpose(1, 2)
        for k, b in zip(keys, bases):
            self._bases[(k, side)] = (shape[0], b.contiguous())

    def orth_rows(self, ft: Tensor) -> Tensor:
        """Orthonormal rows spanning the rows of ``ft`` (a reduced ``Pᵀ`` or ``Qᵀ``), contiguous."""
        return orthogonalize(ft.t(), self.params.orthogonalize, self.params.orth_eps).t().contiguous()

    def adopt(self, ctx: CompressCtx, side: str, new: Tensor, rows: int) -> None:
        """Store the aggregated factor's ``rows`` leading components (after the agreement)."""
        f = self.factors[ctx.key][side]
        f[:rows].copy_(new)
        self._bases.pop((ctx.key, side), None)

    def refresh(self, ctx: CompressCtx, g: Tensor, side: str) -> None:
        """One power iteration on a dense step's exact average ``G`` (identical on every rank, so the factors stay
        replicated): ``Q ← Gᵀ·orth(G·orth(Q))`` for the factor the next compressed step reads (``P`` likewise)."""
        if not self.params.dense_refresh or not self.accepts(ctx.shape):
            return
        n, m = matrix_shape(ctx.shape)
        w = self.width(n, m)
        gm = g.view(n, m)
        if side == "q":
            pht = self.orth_rows(torch.mm(self.basis(ctx, "q", m, w), gm.t()))       # orth(G·Qh)ᵀ
            new = torch.mm(pht, gm)                                                  # (Gᵀ·Ph)ᵀ
        else:
            qht = self.orth_rows(torch.mm(self.basis(ctx, "p", n, w), gm))           # orth(Gᵀ·Ph)ᵀ
            new = torch.mm(qht, gm.t())                                              # (G·Qh)ᵀ
        self.adopt(ctx, side, new, w)
        self.record_energies(ctx, new)     # what each rank would have captured of this exact average

    def record_energies(self, ctx: CompressCtx, rows: Tensor, scale: float = 1.0) -> None:
        """Remember ``scale²·‖row_k‖²`` per component of this step's aggregate (rows against an orthonormal basis,
        so the energy of the rank-r approximation is the sum of the first r entries); only when they are read."""
        if self.wants_energies:
            self._energies[ctx.key] = rows.double().square().sum(dim=1).mul_(scale * scale)

    def component_energies(self, ctx: CompressCtx) -> Optional[Tensor]:
        """This step's per-component energies of the matrix's applied aggregate (popped: read once per step), or
        ``None`` when it travelled plain or no projection was computed. GraVAC's ``"aggregate"`` gain uses them."""
        return self._energies.pop(ctx.key, None)

    # ---- the error memory (LowRankMemory) ----------------------------------------------------------------
    def uses_error(self, ctx: CompressCtx) -> bool:
        return self.params.error_feedback and ctx.error_feedback

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        """``‖D(p)‖²``: a factor against orthonormal columns keeps its norm; plain values are themselves."""
        words = p.words
        return words.double().square().sum()

    @staticmethod
    def prefix(src: Tensor, out: Tensor) -> None:
        """A lower rank's payload from a higher one: the leading rows of ``Fᵀ`` are a contiguous prefix."""
        out.copy_(src[:out.numel()])

    # ---- checkpoints ------------------------------------------------------------------------------------
    def replicated_extra(self) -> dict[str, Any]:
        return {}

    def load_replicated_extra(self, state: dict[str, Any]) -> None:
        """Subclass hook for replicated scalars (ACP's parity)."""

    def state_dict(self) -> dict[str, dict[str, Any]]:
        factors = {k: {s: t.detach().cpu().clone() for s, t in v.items()} for k, v in self.factors.items()}
        return {"replicated": {"factors": factors, **self.replicated_extra()}, "local": {}}

    def load_state_dict(self, state: dict[str, dict[str, Any]], world_size_changed: bool = False) -> None:
        """Factors are replicated: kept across a world-size change (the error memory is what resets)."""
        rep = state.get("replicated") or {}
        self.factors = {k: {s: t.clone() for s, t in v.items()} for k, v in (rep.get("factors") or {}).items()}
        self._bases.clear()
        self.load_replicated_extra(rep)
