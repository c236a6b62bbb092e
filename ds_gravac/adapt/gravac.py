"""GraVAC controller: picks dense / θ_min / θ_c per step from agreed gains and timings.

Pure decision logic. Every value that selects a collective is a float64 function of the replicated state and
the all-reduced stats (R4), so all ranks decide identically without talking to each other.

Probe-slot convention (``StepDecision.probe_levels``; the stats' ``nums[j]`` belongs to ``probe_levels[j]``):
  slot 0 = θ_min (the multi-level first stage), slot 1 = θ_c if it differs from θ_min, then — only in the last
  ``refresh_steps`` steps of a window with ``stale_policy: "refresh"`` — the next candidate, then up to 8 other
  CFs of the throughput table, most recently sent first. Levels ≤ 1 are never probed (δ(1) = 1 by definition),
  so θ_min = 1 means slot 0 is θ_c. The controller reads the gains back by level, never by position alone.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Optional

from ..compress.kinds import GainKind
from ..config import GravacConfig
from ..decision import BRANCH_CODES, MAX_PROBES, Branch, StepDecision
from .base import AgreedStats, Controller, ControllerContext
from .gravac_records import CandidateSequence, GainRecord, Phase, ThroughputRecord
from .gravac_state import gravac_state_dict, load_gravac_state
from .levels import gravac_range

log = logging.getLogger("ds_gravac")

PHASES = tuple(p.value for p in Phase)
PHASE_CODES = {p: i for i, p in enumerate(Phase)}
MAX_TABLE_REFRESH = 8          # R6: up to 8 table CFs + the next candidate (with θ_min, θ_c: ≤ MAX_PROBES)
NAN = float("nan")


def default_alpha(config: GravacConfig, world_size: int) -> float:
    """``ewma_alpha`` or ``clamp(N/100, ewma_alpha_range)``: more ranks average more noise away per step."""
    if config.gravac.ewma_alpha is not None:
        return float(config.gravac.ewma_alpha)
    lo, hi = config.gravac.ewma_alpha_range
    return float(min(max(world_size / 100.0, lo), hi))


def cf_key(cf: float) -> str:
    """Telemetry key of a CF (string keys keep wandb/JSONL happy)."""
    return format(cf, "g")


def _compressor_name(config: GravacConfig) -> str:
    spec = getattr(config, "compressor", None)
    return str(getattr(spec, "type", spec) or "?")


def _compressor_params(config: GravacConfig) -> Mapping[str, Any]:
    return getattr(getattr(config, "compressor", None), "params", None) or {}


def _finite(*values: float) -> bool:
    return all(math.isfinite(float(v)) for v in values)


class GravacController(Controller):
    """Algorithm 1 of the GraVAC paper with the resolutions R1–R9 of docs/algorithms.md; ``decision: "strict"`` defers the branch to :meth:`resolve`."""

    mode = "gravac"

    def __init__(self, config: GravacConfig) -> None:
        super().__init__(config)
        self.i0 = 1 + int(config.warmup_steps)
        self.window = int(config.gravac.window)
        self.alpha = 0.0
        self.phase = Phase.WARMUP
        self.theta_min = float(config.gravac.theta_min)
        self.theta_c = float(config.gravac.theta_min)
        self.j = 0
        self.gains: dict[float, GainRecord] = {}
        self.thru: dict[float, ThroughputRecord] = {}
        self.sent: list[list[Any]] = []            # [step, cf, branch] of the last steps actually sent
        self.last_decided = -1
        self.last_observed = -1
        self.last_boundary = -1
        self.last_branch = Branch.DENSE
        self.last_cf = 1.0
        self.raw_min = NAN
        self.raw_cand = NAN
        self.t_iter_last = NAN
        self.t_sys_last = NAN
        self._seq: Optional[CandidateSequence] = None
        self._initialized = False

    # ---- attach ------------------------------------------------------------------------------------
    def bind(self, ctx: ControllerContext) -> None:
        """Check the compressor can drive GraVAC, then seed θ_min/θ_c (kept if a state was loaded first). A
        quantizer's grid bounds the range: unset theta_min/theta_max span it, set ones snap to it."""
        super().bind(ctx)
        c = self.config
        lo, hi = gravac_range(c, _compressor_name(c), ctx.level_kind, ctx.gain_kind, ctx.cf_grid, ctx.realize_cf)
        self._warn_degenerate(ctx)
        self._seq = CandidateSequence(lo, hi, c.gravac.scaling_policy, c.gravac.step_size, ctx.realize_cf)
        if self._initialized:
            return
        self.alpha = default_alpha(c, ctx.world_size)
        self.theta_min = float(ctx.realize_cf(lo))
        nxt = self._seq.after(self.theta_min)
        if nxt is None:
            log.warning("ds_gravac: no realizable candidate CF above theta_min=%g up to theta_max=%g; "
                        "GraVAC will only choose between %gx and dense", self.theta_min, hi, self.theta_min)
            self.j, self.theta_c = 0, self.theta_min
        else:
            self.j, self.theta_c = nxt
        self._initialized = True

    def _warn_degenerate(self, ctx: ControllerContext) -> None:
        """Compressors GraVAC can drive but whose ε test is degenerate (R5): say which regime applies."""
        name, c = _compressor_name(self.config), self.config
        if name == "randomk":
            if _compressor_params(c).get("rescale", False):
                log.warning("ds_gravac: Random-k with rescale=true has E[gain] = theta >= 1: the epsilon test "
                            "never rejects, so the CF search is driven by throughput alone (docs/algorithms.md, R5)")
            else:
                log.warning("ds_gravac: unscaled Random-k has E[gain] = 1/theta: with epsilon=%g no CF above "
                            "%.3gx passes the epsilon test (docs/algorithms.md, R5; gain_denominator=%r)",
                            c.gravac.epsilon, 1.0 / c.gravac.epsilon, c.gravac.gain_denominator)
        elif ctx.gain_kind == GainKind.UNBIASED:
            log.warning("ds_gravac: compressor %r has gain_kind 'unbiased' (E[gain] >= 1): the epsilon test "
                        "never rejects, so only throughput drives the search over its CFs", name)
        if c.gravac.epsilon > 1.0 and c.gravac.gain_denominator != "raw":
            log.warning("ds_gravac: epsilon=%g > 1 can never pass with gain_denominator %r (gains <= 1)",
                        c.gravac.epsilon, c.gravac.gain_denominator)

    @property
    def strict(self) -> bool:
        return self.config.gravac.decision == "strict"

    # ---- decisions ---------------------------------------------------------------------------------
    def decide(self, step: int, lr: float, force_dense: bool = False) -> StepDecision:
        """Decision of ``step``; window boundaries are processed first (records include step−1 by then)."""
        step = int(step)
        self._enter_adaptive(step)
        if step >= self.i0 + self.window and (step - self.i0) % self.window == 0 and step > self.last_boundary:
            self._boundary(step)
            self.last_boundary = step
        adaptive = step >= self.i0 and not force_dense
        branch, level = self._choose_branch() if adaptive else (Branch.DENSE, 1.0)
        decision = StepDecision(step=step, branch=branch, send_level=level,
                                probe_levels=self._probe_levels(step), deferred=self.strict,
                                forced_dense=bool(force_dense))
        self.last_decided = step
        if not decision.deferred:
            self._record_sent(decision)
        return decision

    def resolve(self, decision: StepDecision, stats: AgreedStats) -> StepDecision:
        """Strict mode: branch from EWMAs that include this step's gains (Alg. 1 ordering)."""
        if not decision.deferred:
            return decision
        self.observe(stats)                       # no-op when the synchronizer already observed it
        if decision.forced_dense or decision.step < self.i0:
            branch, level = Branch.DENSE, 1.0
        else:
            branch, level = self._choose_branch()
        final = dataclasses.replace(decision, branch=branch, send_level=level, deferred=False)
        self._record_sent(final)
        return final

    def _enter_adaptive(self, step: int) -> None:
        if self.phase == Phase.WARMUP and step >= self.i0:
            self.phase = Phase.SEARCH if self.theta_c > self.theta_min else Phase.EXHAUSTED
            self.log_event(step, "phase", phase=self.phase)

    def _choose_branch(self) -> tuple[Branch, float]:
        """Alg. 1 lines 11/16/21: cand if δ̄(θ_c) ≥ ε (needs a record, R8), elif δ̄(θ_min) ≥ ε min, else dense."""
        eps = self.config.gravac.epsilon
        g_c, g_m = self._gain(self.theta_c), self._gain(self.theta_min)
        if g_c is not None and g_c >= eps:
            branch, level = Branch.CAND, self.theta_c
        elif g_m is not None and g_m >= eps:
            branch, level = Branch.MIN, self.theta_min
        else:
            return Branch.DENSE, 1.0
        return (Branch.DENSE, 1.0) if level <= 1.0 else (branch, level)

    def _gain(self, cf: float) -> Optional[float]:
        """δ̄(cf): 1 for dense, ``None`` without a sample."""
        if cf <= 1.0:
            return 1.0
        rec = self.gains.get(cf)
        return None if rec is None else rec.gain(self.config.gravac.gain_ewma)

    def _in_refresh(self, step: int) -> bool:
        c = self.config
        return (c.gravac.stale_policy == "refresh" and c.gravac.refresh_steps > 0 and step >= self.i0
                and (step - self.i0) % self.window >= self.window - c.gravac.refresh_steps)

    def _probe_levels(self, step: int) -> tuple[float, ...]:
        """θ_min, θ_c, and in refresh steps the next candidate plus recently sent table CFs (R6)."""
        levels: list[float] = []

        def add(cf: float) -> None:
            if cf > 1.0 and cf not in levels and len(levels) < MAX_PROBES:
                levels.append(float(cf))

        add(self.theta_min)
        add(self.theta_c)
        frozen = self.phase == Phase.SETTLED and self.config.gravac.settled_policy == "freeze"   # nothing would use it
        if self._in_refresh(step) and not frozen:
            if self.phase in (Phase.SEARCH, Phase.SETTLED) and self._seq is not None:
                nxt = self._seq.after(max(self.theta_min, self.theta_c))
                if nxt is not None:
                    add(nxt[1])
            others = sorted((cf for cf in self.thru if cf > 1.0 and cf not in levels),
                            key=lambda cf: (-self.thru[cf].last_sent_step, cf))
            for cf in others[:MAX_TABLE_REFRESH]:
                add(cf)
        return tuple(levels)

    # ---- window boundary ----------------------------------------------------------------------
    def _boundary(self, step: int) -> None:
        table = self._table(step)
        self.log_event(step, "boundary", window=(step - self.i0) // self.window,
                       table={cf_key(cf): t for cf, t in sorted(table.items())})
        self._escalate(step)
        if self.phase != Phase.SETTLED or self.config.gravac.settled_policy == "recheck":
            if self._saturate(step, table):
                return
        if self.phase == Phase.SEARCH:
            self._advance(step)

    def _table(self, step: int) -> dict[float, float]:
        """T_c = T̄_sys·δ̄ of CFs sent ≥ min_sent_steps times with a usable (refresh: this window's) gain."""
        start = step - self.window
        table: dict[float, float] = {}
        for cf, rec in self.thru.items():
            if rec.sent_count < self.config.gravac.min_sent_steps:
                continue
            gain = self._gain(cf)
            if gain is None:
                continue
            if cf > 1.0 and self.config.gravac.stale_policy == "refresh" and self.gains[cf].last_step < start:
                continue                                  # stale gain: left out of the saturation test (R6)
            table[cf] = rec.t_sys * gain
        return table

    def _escalate(self, step: int) -> None:
        """R2: θ_min ← θ_c (the CF just evaluated) when their gains are within ω."""
        if self.theta_c <= self.theta_min:
            return
        g_m, g_c = self._gain(self.theta_min), self._gain(self.theta_c)
        if g_m is not None and g_c is not None and g_m > 0 and abs(g_m - g_c) / g_m <= self.config.gravac.omega:
            self.log_event(step, "escalate", theta_min_old=self.theta_min, theta_min=self.theta_c,
                           gain_min=g_m, gain_cand=g_c)
            self.theta_min = self.theta_c

    def _saturate(self, step: int, table: Mapping[float, float]) -> bool:
        """R3: top two T_c within ω → settle on the lower CF of the two. Returns True when settled."""
        ranked = sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))
        if len(ranked) >= 2:
            (cf_a, t_a), (cf_b, t_b) = ranked[0], ranked[1]
            if t_b > 0 and (t_a - t_b) / t_b <= self.config.gravac.omega:
                ideal = min(cf_a, cf_b)
                self.log_event(step, "settled", theta_ideal=ideal, theta_c_old=self.theta_c,
                               top=[[cf_a, t_a], [cf_b, t_b]])
                self.phase, self.theta_c = Phase.SETTLED, ideal
                if ideal < self.theta_min:
                    self.theta_min = ideal
                return True
        if self.phase == Phase.SETTLED:
            self.phase = Phase.SEARCH
            self.log_event(step, "recheck_failed", theta_c=self.theta_c)
        return False

    def _advance(self, step: int) -> None:
        nxt = self._seq.after(max(self.theta_min, self.theta_c)) if self._seq is not None else None
        if nxt is None:
            self.phase = Phase.EXHAUSTED
            self.log_event(step, "exhausted", theta_c=self.theta_c)
            return
        old, (self.j, self.theta_c) = self.theta_c, nxt
        self.log_event(step, "cf_change", theta_c_old=old, theta_c=self.theta_c, j=self.j)

    # ---- feedback ----------------------------------------------------------------------------------
    def observe(self, stats: AgreedStats) -> None:
        """Apply one step's agreed stats: gain records of its probes, T̄_sys of the CF sent one step earlier."""
        if stats.step <= self.last_observed:
            return
        self.last_observed = stats.step
        self._observe_gains(stats)
        self._observe_timing(stats)

    def _observe_gains(self, stats: AgreedStats) -> None:
        if self.config.gravac.gain_denominator == "aggregate":      # the previous step's gain on the averaged gradient
            agg = stats.aggregate
            if agg is None:
                return
            den, levels, nums, step = agg.den, agg.levels, list(agg.nums), agg.step
        else:
            den = stats.den_raw if self.config.gravac.gain_denominator == "raw" else stats.den
            levels, nums, step = (stats.decision.probe_levels, list(stats.nums[:len(stats.decision.probe_levels)]),
                stats.step)
        if stats.nonfinite > 0 or not _finite(den, *[n for n in nums if n is not None]):
            self.log_event(stats.step, "nonfinite_stats", count=stats.nonfinite)
            return
        raws: dict[float, float] = {}
        for level, num in zip(levels, nums):
            if level > 1.0 and num is not None:       # None: not measurable at that step (aggregate gain)
                rec = self.gains.setdefault(float(level), GainRecord())
                raws[float(level)] = rec.update(float(num), float(den), self.alpha, step)
        self.raw_min = 1.0 if self.theta_min <= 1.0 else raws.get(self.theta_min, NAN)
        self.raw_cand = 1.0 if self.theta_c <= 1.0 else raws.get(self.theta_c, NAN)

    def _observe_timing(self, stats: AgreedStats) -> None:
        t_iter = float(stats.t_iter_prev)
        prev = self._sent_at(stats.step - 1)
        if prev is None or not (_finite(t_iter) and t_iter > 0):
            return
        cf, branch = prev
        t = t_iter - float(stats.t_gain_prev) if branch == Branch.DENSE and _finite(stats.t_gain_prev) else t_iter
        if t <= 0:
            return
        n = self.ctx.world_size if self.ctx is not None else stats.world_size
        b = self.ctx.samples_per_step if self.ctx is not None else 1
        t_sys = n * b / t
        self.thru.setdefault(cf, ThroughputRecord()).update(t_sys, self.alpha, stats.step - 1)
        self.t_iter_last, self.t_sys_last = t_iter, t_sys

    def _record_sent(self, decision: StepDecision) -> None:
        level = 1.0 if decision.branch == Branch.DENSE else float(decision.send_level)
        self.sent = [s for s in self.sent if s[0] != decision.step][-2:] + [[decision.step, level,
                                                                             decision.branch.value]]
        self.last_branch, self.last_cf = decision.branch, level

    def _sent_at(self, step: int) -> Optional[tuple[float, str]]:
        for s, cf, branch in self.sent:
            if s == step:
                return float(cf), str(branch)
        return None

    # ---- telemetry and state -----------------------------------------------------------------------
    def telemetry(self) -> dict[str, Any]:
        g_m, g_c = self._gain(self.theta_min), self._gain(self.theta_c)
        return {
            "gravac/branch": BRANCH_CODES[str(self.last_branch)],
            "gravac/cf_sent": self.last_cf,
            "gravac/theta_min": self.theta_min,
            "gravac/theta_c": self.theta_c,
            "gravac/step_size": self.theta_c / self.theta_min,
            "gravac/phase": PHASE_CODES[self.phase],
            "gravac/gain_min": NAN if g_m is None else g_m,
            "gravac/gain_cand": NAN if g_c is None else g_c,
            "gravac/gain_min_raw": self.raw_min,
            "gravac/gain_cand_raw": self.raw_cand,
            "gravac/t_iter": self.t_iter_last,
            "gravac/t_sys": self.t_sys_last,
            "gravac/t_compression": self.throughput_table(),
            "gravac/alpha": self.alpha,
        }

    def throughput_table(self) -> dict[str, float]:
        """Current T_c per CF with both a throughput and a gain (unfiltered; the boundary event has the used one)."""
        out: dict[str, float] = {}
        for cf in sorted(self.thru):
            gain = self._gain(cf)
            if gain is not None:
                out[cf_key(cf)] = self.thru[cf].t_sys * gain
        return out

    def state_dict(self) -> dict[str, Any]:
        return gravac_state_dict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_gravac_state(self, state)
