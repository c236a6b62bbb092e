"""Accordion baseline: per-layer low/high compression, switched only at interval boundaries.

Rank 0 compares per-layer norms of accumulated local gradients between consecutive accumulation windows and
broadcasts one int64 code per compressible tensor (0 = low compression, 1 = high); every rank applies it. A
learning-rate decay forces low compression until the next decision point; the learning rate it compares is the
agreed one (rank 0's value from the per-step statistics exchange, so one step late), never a rank-local read.
Local timings are never used. Proposals are idempotent per step: a step that is repeated (its optimizer step was
skipped because a gradient was not finite) proposes the same codes again.

Windows: decision steps ``s_k = k·I``; ``W_0 = [0, A)``, ``W_k = [s_k − A, s_k)`` for k ≥ 1. When A = I,
``W_1 = W_0`` and is accumulated once. Only rank 0 accumulates (its sums are the only ones used).
Checkpoints hold the norms of finished windows, not partial sums: after a resume inside an accumulation window
that window is incomplete and its decision point puts every layer in low compression (the safe, "critical"
choice, as when a reference norm is missing or zero).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch

from ..config import GravacConfig
from ..errors import GravacConfigError
from ..decision import BRANCH_CODES, StepDecision
from .base import Controller, ControllerContext
from ..compress.kinds import LevelKind
from .levels import DEFAULT_LEVELS, accordion_levels

LOW, HIGH = 0, 1
STATE_VERSION = 1


class AccordionController(Controller):
    """Critical-regime detection by relative change of accumulated gradient norms [Accordion]."""

    mode = "accordion"

    def __init__(self, config: GravacConfig) -> None:
        super().__init__(config)
        acc = config.accordion
        if acc.interval_steps is None:
            raise GravacConfigError("ds_gravac: accordion.interval_steps is required when mode is 'accordion'")
        self.interval = int(acc.interval_steps)
        self.accum = int(acc.accum_steps or self.interval)
        self.eta = float(acc.eta)
        self.low, self.high = DEFAULT_LEVELS[LevelKind.CF]
        self.names: tuple[str, ...] = ()
        self.codes: list[int] = []
        self.norms: dict[int, Optional[dict[str, float]]] = {}   # window index → per-layer norm (None: incomplete)
        self.prev_lr: Optional[float] = None
        self.override_until = -1
        self.last_decided = -1
        self.last_branch = "dense"
        self.low_fraction = 1.0
        self._sums: dict[int, dict[str, torch.Tensor]] = {}
        self._steps: dict[int, set[int]] = {}
        self._collect_step = -1
        self._collect_windows: tuple[int, ...] = ()

    # ---- attach ------------------------------------------------------------------------------------
    def bind(self, ctx: ControllerContext) -> None:
        """Resolve the two levels for this compressor (CFs, grid CFs of a quantizer, or ranks) and start with
        every layer low."""
        super().bind(ctx)
        name = str(getattr(self.config.compressor, "type", "?"))
        self.low, self.high = accordion_levels(self.config.accordion, name, ctx.level_kind, ctx.cf_grid,
                                               ctx.realize_cf)
        names = tuple(ctx.compressible)
        if names != self.names or len(self.codes) != len(names):
            self.names, self.codes = names, [LOW] * len(names)

    # ---- windows -----------------------------------------------------------------------------------
    def _windows_of(self, step: int) -> tuple[int, ...]:
        """Accumulation windows containing ``step`` (W_0 is folded into W_1 when A = I)."""
        out = []
        if step < self.accum and self.accum != self.interval:
            out.append(0)
        k = step // self.interval + 1
        if step >= k * self.interval - self.accum:
            out.append(k)
        return tuple(out)

    def _window_end(self, k: int) -> int:
        return self.accum if k == 0 else k * self.interval

    def _finalize(self, upto_step: int, complete_only: bool = False) -> None:
        """Turn window sums into per-layer L2 norms once the window is over (or fully collected)."""
        for k in sorted(set(self._sums) | set(self._steps)):
            full = len(self._steps.get(k, ())) == self.accum
            if self._window_end(k) <= upto_step or (complete_only and full):
                sums = self._sums.pop(k, {})
                self._steps.pop(k, None)
                self.norms[k] = ({n: float(torch.linalg.vector_norm(t.double())) for n, t in sums.items()}
                                 if full else None)

    def collects_gradients(self, step: int) -> bool:
        """Rank 0 accumulates local gradients of steps inside an accumulation window; other ranks never do."""
        if self.ctx is not None and self.ctx.rank != 0:
            return False
        self._finalize(step)
        self._collect_step, self._collect_windows = int(step), self._windows_of(int(step))
        return bool(self._collect_windows)

    def collect(self, name: str, grad: torch.Tensor) -> None:
        flat = grad.detach().reshape(-1)
        for k in self._collect_windows:
            sums = self._sums.setdefault(k, {})
            if name in sums:
                sums[name].add_(flat.to(sums[name].dtype))
            else:
                sums[name] = flat.to(torch.float32, copy=True)
            self._steps.setdefault(k, set()).add(self._collect_step)

    # ---- rank-0 proposal and its application -------------------------------------------------------
    def broadcast_point(self, step: int) -> bool:
        return step % self.interval == 0

    def proposal_size(self) -> int:
        return len(self.names)

    def propose(self, step: int, lr: float) -> torch.Tensor:
        """Rank 0: ρ_l = |n_l(k−1) − n_l(k)| / n_l(k−1); ρ ≥ η (or n(k−1) = 0) → low, else high."""
        k = int(step) // self.interval
        self._finalize(int(step))
        codes = [LOW] * len(self.names)
        if k >= 2 or (k == 1 and self.accum != self.interval):
            prev, cur = self.norms.get(k - 1), self.norms.get(k)
            if prev is None or cur is None:
                self.log_event(step, "accordion_incomplete_window", window=k)
            else:
                codes = [self._code(prev.get(n, 0.0), cur.get(n, 0.0)) for n in self.names]
        self.norms = {w: v for w, v in self.norms.items() if w >= k - 1}   # k−1 kept: a repeated step re-proposes
        return torch.tensor(codes, dtype=torch.int64)

    def _code(self, n_prev: float, n_cur: float) -> int:
        if not n_prev > 0.0 or not math.isfinite(n_cur):
            return LOW
        return LOW if abs(n_prev - n_cur) / n_prev >= self.eta else HIGH

    def accept(self, step: int, proposal: torch.Tensor) -> set[str]:
        """Every rank: adopt rank 0's per-layer codes from this decision point on; returns the switched tensors."""
        codes = [int(c) for c in proposal.reshape(-1).tolist()]
        if len(codes) != len(self.names):
            raise GravacConfigError(f"ds_gravac: accordion proposal has {len(codes)} codes, "
                                    f"expected {len(self.names)}")
        to_low = [n for n, old, new in zip(self.names, self.codes, codes) if old != new and new == LOW]
        to_high = [n for n, old, new in zip(self.names, self.codes, codes) if old != new and new == HIGH]
        if to_low or to_high:
            self.log_event(step, "accordion_switch", to_low=to_low, to_high=to_high)
        self.codes = codes
        return set(to_low) | set(to_high)

    # ---- decisions ---------------------------------------------------------------------------------
    def decide(self, step: int, lr: float, force_dense: bool = False) -> StepDecision:
        """Per-layer levels from the accepted codes; after an LR decay every layer is low until the next s_k."""
        step, lr = int(step), float(lr)
        if self.config.accordion.lr_decay_rule and self.prev_lr is not None and lr < self.prev_lr:
            until = (step // self.interval + 1) * self.interval
            if until > self.override_until:
                self.override_until = until
                self.log_event(step, "accordion_lr_decay", lr=lr, prev_lr=self.prev_lr, low_until=until)
        if math.isfinite(lr):       # NaN: no agreed learning rate yet (first step)
            self.prev_lr = lr
        self.last_decided = step
        if force_dense:
            self.last_branch = "dense"
            return StepDecision(step=step, branch="dense", send_level=1.0, forced_dense=True)
        override = step < self.override_until
        levels = {n: self.low if override or c == LOW else self.high for n, c in zip(self.names, self.codes)}
        n_low = sum(1 for v in levels.values() if v == self.low)
        self.low_fraction = n_low / len(levels) if levels else 0.0
        self.last_branch = "cand"
        return StepDecision(step=step, branch="cand", send_level=self.high, layer_levels=levels)

    # ---- telemetry and state -----------------------------------------------------------------------
    def telemetry(self) -> dict[str, Any]:
        return {"accordion/low_fraction": self.low_fraction,
                "accordion/lr_override": int(self.last_decided < self.override_until),
                "accordion/low_level": self.low, "accordion/high_level": self.high,
                "gravac/branch": BRANCH_CODES[str(self.last_branch)]}

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly; fully collected windows are reduced to norms first so they survive a resume."""
        self._finalize(-1, complete_only=True)
        return {"version": STATE_VERSION, "mode": self.mode, "names": list(self.names), "codes": list(self.codes),
                "norms": [[k, v] for k, v in sorted(self.norms.items())], "prev_lr": self.prev_lr,
                "override_until": self.override_until, "last_decided": self.last_decided,
                "last_branch": str(self.last_branch), "low_fraction": self.low_fraction}

    def replicated_state(self) -> dict[str, Any]:
        """Everything but the window norms, which only rank 0 accumulates (its proposals are broadcast)."""
        return {"names": list(self.names), "codes": list(self.codes), "prev_lr": self.prev_lr,
                "override_until": self.override_until, "last_decided": self.last_decided,
                "last_branch": str(self.last_branch), "low": self.low, "high": self.high}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("mode", self.mode) != self.mode:
            raise GravacConfigError(f"ds_gravac: checkpoint holds a {state.get('mode')!r} controller state, "
                                    f"not {self.mode!r}")
        names = tuple(state["names"])
        codes = [int(c) for c in state["codes"]]
        if self.names and names != self.names:        # plan changed: keep the safe default (all low)
            self.log_event(int(state["last_decided"]), "accordion_layers_changed")
            codes = [LOW] * len(self.names)
            names = self.names
        self.names, self.codes = names, codes
        self.norms = {int(k): (None if v is None else {str(n): float(x) for n, x in v.items()})
                      for k, v in state["norms"]}
        self.prev_lr = None if state["prev_lr"] is None else float(state["prev_lr"])
        self.override_until = int(state["override_until"])
        self.last_decided = int(state["last_decided"])
        self.last_branch = str(state["last_branch"])
        self.low_fraction = float(state["low_fraction"])
        self._sums, self._steps = {}, {}
