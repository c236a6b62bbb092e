"""``mode: "auto"``: one level per layer group — a PowerSGD rank, QSGD's bits or Top-k's CF, the family of the
configured compressor — re-planned every ``interval_steps`` under an error budget.

* **Groups** (``ladder.build_groups`` over the compressed tensors, the compressor's family): one per matrix shape
  class, the classifier alone; groups below ``pin_below_numel`` values and the classifier keep dense or the
  family's reference level and above (rank ≥ 16, 8 bits, CF ≤ 30). No bucket mixes groups.
* **Levels of a tensor**: a group's code indexes its ladder; a rank rung is the tensor's rank (bits b: CF 32/b;
  a Top-k rung: its CF), the dense rung is a level no tensor can pay for (:data:`PLAIN`), which the planner
  sends as a dense bucket (in ``auto.dense_dtype``), its error memory cleared. A step whose groups are all dense
  is a dense step (on the sampled steps, ``measures``, the warm start then follows the exact average and every
  ladder rank is measured).
* **Error signals**: unsent energy of the averaged update (low rank: ``sync/aggregate_gain.py``; Top-k:
  ``sync/sparse_unsent.py``) or QSGD's added variance (``sync/quant_variance.py``), agreed, per group and level.
* **Re-projection before a raise**: a group whose new code raises its rank (from a lower rank, or from dense,
  whose factors a plain step does not move) travels plain for the decision's step at :data:`REPROJECT` — its
  warm start takes one power iteration on the exact average and every rank of it is measured — and at the new
  rank from the next step on.
* **Decision** at steps ``start + k·I``: rank 0 prices every rung (``timing.Pricer`` over the agreed fits of the
  link timed at attach, ``timing.measure_link``, or the nominal link of ``auto.link_gbit_s``), takes every
  rung's error from the agreed per-group signals (``signals.GroupErrors``, ``signals.GroupLevelErrors``), and
  solves the knapsack with hysteresis (``solver.Hysteresis``) under ``β·error(reference)`` (``budget``: the
  family's validated level on every group, or a rank measured exact; over QSGD, while quiet, at least the variance
  ``auto.efficiency_floor`` allows). It broadcasts one int64 code per group plus the phase.
* **Phases**: the budget is ``budget_tight`` for decisions within ``tight_steps`` of the start, of a drop of
  the agreed learning rate (a step-to-step decrease by at least ``lr_drop`` of it) and of a decision at which
  Accordion's norm-change rule fired on some group (``detector_eta``), ``budget_quiet`` otherwise; with
  ``tight_time_slack`` a tight β only as low as keeps the step within that fraction of the quiet plan's.
* **Refit**: each decision predicts the next interval's step (the last interval's measured step minus the
  predicted exchange of the plan it ran, plus the new plan's: the compute term is re-fitted every decision); a
  step off its prediction in one direction at two decisions in a row re-times the link on every rank before
  rank 0 proposes (``refit.StepOffRule``).
* **Buckets**: each group in buckets of its own (``auto.buckets: "groups"``), or, over low rank, the engine's
  (``"shared"``: fewer collectives; a dense-rung group rides plain fp32, priced so by ``timing.Pricer``).
* **Trial**: a mixed plan must measure ``min_gain`` faster than the reference, else the reference is held
  (``trial.TrialCheck``).

Everything that changes replicated state happens on every rank from agreed values (``accept``, ``decide``,
``observe``); rank 0's ``propose`` works on copies.
"""
from __future__ import annotations

import copy
import math
import statistics
from typing import Any, Mapping, Optional, Sequence

import torch

from ...config import GravacConfig
from ...errors import GravacConfigError
from ...compress.kinds import PLAIN, REPROJECT
from ...compress.qsgd import LEVELS_FOR_CF
from ...sync.aggregate_gain import GroupSpec
from ...sync.cost_model.fits import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, FitTable
from ...sync.host_values import to_list
from ...sync.quant_variance import VarianceSpec
from ...sync.sparse_unsent import UnsentSpec
from ...decision import StepDecision
from ..base import AgreedStats, Controller, ControllerContext
from .ladder import (DENSE, LOWRANK, QSGD, QSGD_BITS, RANKS, REFERENCE, SPARSE, SPARSE_CFS, Group, Level, build_groups,
                     member_levels, uniform_codes)
from .signals import GroupErrors, GroupLevelErrors
from .budget import Budget, error_budget, exact_reference
from .solver import Hysteresis, totals
from .refit import StepOffRule
from .state import auto_state_dict, load_auto_state
from .timing import Pricer, pricer_for
from .trial import TrialCheck

FIRST_SIGNAL_STEP = 2        # step 0's signals arrive with step 1's statistics: the first plan at step 2
STEP_TIMES_KEPT = 100000     # a bound on the interval's measured steps (an interval is at most 100,000 steps)
QSGD_CFS = tuple(32.0 / b for b in QSGD_BITS)      # 8, 4, 2 bits: CF 4, 8, 16
FAMILY_CODES = {LOWRANK: 0, QSGD: 1, SPARSE: 2}    # telemetry "auto/family_code": what auto/level/<group> counts


def family_of(compressor_type: str) -> str:
    """The ladder family a compressor drives: QSGD's bits, Top-k's CFs, or a low-rank compressor's ranks."""
    return {"qsgd": QSGD, "topk": SPARSE}.get(compressor_type, LOWRANK)


class AutoController(Controller):
    """See the module docstring."""

    mode = "auto"

    def __init__(self, config: GravacConfig) -> None:
        super().__init__(config)
        a = config.auto
        self.interval = int(a.interval_steps)
        self.start = max(int(a.warmup_steps), FIRST_SIGNAL_STEP)
        self.sample_steps = int(a.sample_steps)
        self.tight_steps = self.interval if a.tight_steps is None else int(a.tight_steps)
        self.family = family_of(config.compressor.type)
        self.shared = a.buckets == "shared" and self.family == LOWRANK      # the config refuses it for the others
        self.groups: list[Group] = []
        self.codes: list[int] = []
        self.reference: list[int] = []
        self.exact: Optional[list[int]] = None      # per group, the rank the dense start measured exact (0: none)
        self.signals: GroupErrors | GroupLevelErrors = GroupErrors([], RANKS)
        self.hyst = Hysteresis(0, float(a.min_gain), int(a.dwell))
        self.trial = TrialCheck(float(a.min_gain), int(a.trial_hold_max) if a.link == "measure" else 0)
        self.decisions = 0
        self.tight_until = self.start + self.tight_steps
        self.prev_lr: Optional[float] = None
        self.tight = True
        self.last = {"time": 0.0, "ref_time": 0.0, "error": 0.0, "ref_error": 0.0, "budget": 0.0,
                     "step": 0.0, "measured_step": 0.0, "compute": 0.0}
        self.prev_codes: list[int] = []             # the codes of the interval before the current one
        self.step_times: list[float] = []           # this interval's agreed measured steps (mean over ranks)
        self._levels: dict[str, float] = {}
        self.reproject: list[int] = []              # groups raised by the last decision: plain at REPROJECT ...
        self.reproject_step = -1                    # ... on this step (the decision's), then at their new rank
        self.off = StepOffRule(a.refit_tolerance)  # the last decision's step off its prediction: +1 over, −1 under
        self._fits: Optional[FitTable] = None        # re-timed link (auto.remeasure_decisions), newer than attach's
        # (pricer key, times, the pricer): derived, not state
        self._priced: Optional[tuple[tuple, list[list[float]], Pricer]] = None

    # ---- groups (called by the synchronizer before the first plan) ----------------------------------------
    def signal_groups(self, named_shapes: Sequence[tuple[str, Sequence[int]]]
                      ) -> GroupSpec | VarianceSpec | UnsentSpec:
        """The groups of the compressed tensors, and what the statistics must measure for them (over a quantizer
        or a sparsifier also that each group needs buckets of its own)."""
        rate = float(self.config.compressor.params.get("min_compression_rate", 2.0))
        self.groups = build_groups(named_shapes, families=(self.family,), classifier="auto",
                                   min_numel=int(self.config.auto.pin_below_numel), min_compression_rate=rate)
        self.reference = uniform_codes(self.groups, Level(self.family, REFERENCE[self.family]))
        self.codes = [0] * len(self.groups)
        self.prev_codes = list(self.codes)
        self.hyst = Hysteresis(len(self.groups), self.hyst.min_gain, self.hyst.dwell)
        self._levels = member_levels(self.groups, self.codes, PLAIN)
        members = {m: g.index for g in self.groups for m in g.members}
        if self.family == SPARSE:
            self.signals = GroupLevelErrors(self.groups, SPARSE, SPARSE_CFS)
            return UnsentSpec(members=members, count=len(self.groups), cfs=SPARSE_CFS)
        if self.family == QSGD:
            self.signals = GroupLevelErrors(self.groups, QSGD, QSGD_CFS)
            block = int(self.config.compressor.params.get("bucket_size", 128))
            return VarianceSpec(members=members, count=len(self.groups), cfs=QSGD_CFS,
                                s=tuple(LEVELS_FOR_CF[cf] for cf in QSGD_CFS), block=block)
        self.signals = GroupErrors(self.groups, RANKS)
        # "groups": buckets of their own, so a group at the dense rung is a dense bucket, all-reduced in the dense
        # dtype (bf16), not plain fp32 values riding in another group's low-rank payload at twice the bytes;
        # "shared": the engine's buckets, a few collectives for all groups
        return GroupSpec(members=members, count=len(self.groups), ranks=RANKS, bucketed=not self.shared)

    def hold_reference(self) -> None:
        """Hold the reference codes: the plan tool's offline picture (no plan is predicted slower or noisier)."""
        self.codes, self._levels = list(self.reference), member_levels(self.groups, self.reference, PLAIN)

    @property
    def codec_levels(self) -> tuple[float, ...]:
        """The compressor levels whose encode and decode ``auto.link: "measure"`` times on this core (QSGD's and
        Top-k's CFs; low rank's codec is the ``gemm`` line)."""
        return {QSGD: QSGD_CFS, SPARSE: SPARSE_CFS}.get(self.family, ())

    @property
    def link_ops(self) -> tuple[str, ...]:
        """The collectives the levels use, which ``auto.link: "measure"`` times: the all-reduce (dense, low rank),
        the all-gather of a quantizer's partitions (and the all-to-all of CaSync-PS above two ranks) or of
        Top-k's index-value pairs."""
        ops = {QSGD: (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL), SPARSE: (ALL_REDUCE, ALL_GATHER)}
        return ops.get(self.family, (ALL_REDUCE,))

    def bind(self, ctx: ControllerContext) -> None:
        super().bind(ctx)
        grouped = {m for g in self.groups for m in g.members}
        if grouped != set(ctx.compressible):
            raise GravacConfigError("ds_gravac: mode 'auto' found no groups for the compressed tensors (the "
                                    "synchronizer did not ask for them)")

    # ---- signals ------------------------------------------------------------------------------------------
    def observe(self, stats: AgreedStats) -> None:
        sample = stats.aggregate
        if sample is not None and sample.groups:
            self.signals.add(sample.groups)
        t = float(stats.t_iter_prev)
        if math.isfinite(t) and t > 0.0 and len(self.step_times) < STEP_TIMES_KEPT:
            self.step_times.append(t)

    def _measured_step(self) -> Optional[float]:
        """The interval's median measured step (robust to the odd evaluation or checkpoint step)."""
        return float(statistics.median(self.step_times)) if self.step_times else None

    def _fired(self, signals: GroupErrors) -> list[str]:
        """Groups whose norm changed by at least ``detector_eta`` between the last two intervals while their level
        stayed the same (a level change moves the error-feedback energy itself, which is not a change of
        training)."""
        eta = self.config.auto.detector_eta
        if eta is None:
            return []
        changes = signals.norm_changes()
        return [g.name for g, ch, before, now in zip(self.groups, changes, self.prev_codes, self.codes)
                if before == now and ch >= float(eta)]

    def _pricer(self) -> Pricer:
        """The agreed measured fits (the re-timed link, else attach's), else the configured nominal link."""
        fits = self._fits
        if fits is None and self.ctx is not None and self.ctx.cost_fits is not None:
            fits = self.ctx.cost_fits()
        return pricer_for(fits, self.family, self.config, self.ctx.world_size if self.ctx is not None else 2,
                          self.ctx.dense_bytes_per_element if self.ctx is not None else 4, shared=self.shared)

    def _tables(self, signals: GroupErrors) -> tuple[list[list[float]], list[list[float]]]:
        """Every rung's seconds (priced once per set of fits: rank 0 prices at ``propose``, every rank again at
        ``accept``) and unsent energy."""
        pricer = self._pricer()
        key = pricer.key
        if self._priced is None or self._priced[0] != key:
            self._priced = (key, pricer.times(self.groups), pricer)
        exact = (self._exact(signals),) if isinstance(signals, GroupErrors) else ()
        return [list(row) for row in self._priced[1]], signals.errors(self.groups, *exact)

    def _exact(self, signals: GroupErrors) -> list[int]:
        """Each group's exact rank (``GroupErrors.exact_ranks``): read from the dense start, then kept."""
        fraction = float(self.config.auto.exact_fraction)
        return list(self.exact) if self.exact is not None else signals.exact_ranks(self.groups, fraction)

    def _exchange(self, times: Sequence[Sequence[float]], codes: Sequence[int]) -> float:
        """Predicted exchange seconds of a plan, by the pricer ``_tables`` priced ``times`` with."""
        if self._priced is None:
            raise RuntimeError("ds_gravac: auto priced a plan before pricing its levels (_tables first)")
        return self._priced[2].plan_time(self.groups, times, codes)

    def _budget(self, errors: list[list[float]], times: list[list[float]], tight: bool,
                signals: GroupErrors | GroupLevelErrors) -> Budget:
        signal = signals.signal() if isinstance(signals, GroupLevelErrors) else None
        return error_budget(self.config.auto, self.family, times, errors, self.reference, tight, signal, self.groups,
                            compute_s=float(self.last["compute"]))

    def _reference_now(self, signals: GroupErrors | GroupLevelErrors) -> list[int]:
        """The reference in force (``budget.exact_reference``: a group a rank sends exactly is referenced there)."""
        if self.family != LOWRANK or not signals.ready:
            return list(self.reference)
        return exact_reference(self.groups, self._tables(signals)[1], self.reference)

    # ---- the rank-0 decision and its application -------------------------------------------------------
    def broadcast_point(self, step: int) -> bool:
        return step >= self.start and (step - self.start) % self.interval == 0

    def measures(self, step: int) -> bool:
        """Every step before the first decision, then the ``sample_steps`` + 1 steps before each decision: step
        i's signals arrive with step i + 1's statistics, so a decision at D reads D − K − 1 … D − 2 (K samples),
        and D − 1's counts towards the next interval. The steps between take no signals (their per-group terms
        cost a pass over every gradient in float64) and, over low rank, skip a dense step's power iteration."""
        step = int(step)
        if step < self.start or (step == self.reproject_step and self.reproject):
            return True         # a re-projection's power iteration is what makes the raised rank current
        to_next = self.interval - (step - self.start) % self.interval      # steps until the next decision
        return to_next <= self.sample_steps + 1

    def before_proposal(self, step: int) -> None:
        """Every rank re-times the link (agreed fits) every ``remeasure_decisions``-th decision after the first,
        and when the measured step was off its prediction in one direction at this and the last decision (agreed
        values: the same on every rank), so the plan about to be proposed prices the network as it is now."""
        every = int(self.config.auto.remeasure_decisions)
        measure = self.ctx.measure_link if self.ctx is not None else None
        periodic = bool(every and self.decisions and self.decisions % every == 0)
        off = self.off.off(self._measured_step(), self.last["step"])
        persistent = self.off.persistent(off)
        if measure is not None and (periodic or persistent):
            self.off.restart()
            if not self.trial.link_b > 0.0 and self.ctx.cost_fits is not None:
                self.trial.link_b = float(self.ctx.cost_fits().get(ALL_REDUCE).b)     # attach's link: the baseline
            self._fits = measure()
            link = self._fits.get(ALL_REDUCE)
            self.log_event(step, "auto_link_measured", all_reduce_a=link.a, all_reduce_b=link.b,
                           reason="periodic" if periodic else "step_off", measured_over_predicted=off)
            if self.trial.link_measured(float(link.b)):
                self.log_event(step, "auto_trial_reset", all_reduce_b=link.b)

    def proposal_size(self) -> int:
        return len(self.groups) + 1

    def _lr_dropped(self, lr: float) -> bool:
        """A step-to-step decrease of the agreed rate by at least ``lr_drop`` of it (a step schedule's drop; the
        small steps of a smooth decay are not drops)."""
        drop = float(self.config.auto.lr_drop)
        return self.prev_lr is not None and math.isfinite(lr) and lr <= (1.0 - drop) * self.prev_lr

    def propose(self, step: int, lr: float) -> torch.Tensor:
        """Rank 0: the plan from this interval's signals (on copies: the replicated state changes in accept)."""
        signals = copy.deepcopy(self.signals)
        signals.close_interval()
        tight = int(step) < self.tight_until or self._lr_dropped(float(lr)) or bool(self._fired(signals))
        codes = list(self.codes)
        if signals.ready:
            times, errors = self._tables(signals)
            budget = self._budget(errors, times, tight, signals)
            reference = list(budget.reference)
            codes = list(copy.deepcopy(self.hyst).step(self.decisions, self.codes, times, errors, budget.total,
                                                       compute_s=self.last["compute"], reference=reference,
                                                       caps=budget.caps)[0])
            trial = copy.deepcopy(self.trial)
            trial.judge(self.codes, reference, not self.tight, self._measured_step())
            if trial.holding and not tight and budget.ref_error <= budget.total:
                codes = reference                  # a mixed plan failed its measured trial: hold the reference
        return torch.tensor(codes + [int(tight)], dtype=torch.int64)

    def accept(self, step: int, proposal: torch.Tensor) -> set[str]:
        """Every rank: adopt rank 0's codes and phase, fold the interval's signals, record the prediction."""
        values = [int(v) for v in to_list(proposal.reshape(-1))]      # from the control channel: host
        codes, tight = values[:-1], bool(values[-1]) if values else True
        if len(codes) != len(self.groups) or any(not 0 <= c < len(g.ladder) for c, g in zip(codes, self.groups)):
            raise GravacConfigError(f"ds_gravac: auto proposal {values} does not fit the {len(self.groups)} groups")
        self.signals.close_interval()
        if self.exact is None and self.signals.ready and isinstance(self.signals, GroupErrors):
            self.exact = self._exact(self.signals)                 # every step so far was dense
        fired = self._fired(self.signals)
        if fired:
            self.tight_until = max(self.tight_until, step + self.tight_steps)
            self.log_event(step, "auto_norm_change", groups=fired, tight_until=self.tight_until)
        measured = self._measured_step()
        failed = self.trial.judge(self.codes, self._reference_now(self.signals), not self.tight, measured)
        if failed:
            self.log_event(step, "auto_trial_failed", measured_step=measured, reference_step=self.trial.ref_step,
                           hold=self.trial.hold)
        self.trial.spend(not tight)
        switched: set[str] = set()
        for g, (old, new) in enumerate(zip(self.codes, codes)):
            if old != new:
                self.hyst.changed_at[g] = self.decisions
                switched.update(self.groups[g].members)
        if switched:
            self.log_event(step, "auto_switch", codes=codes, tight=tight)
        self.decisions += 1
        # after an all-dense interval every warm start followed the exact average on the sampled steps, the
        # last of them the step before this decision (``measures``): nothing to do
        fresh = all(g.ladder[c].family != LOWRANK for g, c in zip(self.groups, self.codes))
        self.reproject = [] if fresh else [g for g, (old, new) in enumerate(zip(self.codes, codes))
                                           if self._raises(g, old, new)]
        self.reproject_step = step
        ran = self.codes
        self.prev_codes, self.codes, self.tight = ran, codes, tight
        self._levels = member_levels(self.groups, codes, PLAIN)
        if self.signals.ready:
            times, errors = self._tables(self.signals)
            b = self._budget(errors, times, tight, self.signals)
            ref_t, ref_e, budget = b.ref_time, b.ref_error, b.total
            t, e = self._exchange(times, codes), totals(times, errors, codes)[1]
            self.log_event(step, "auto_plan", error=[row[c] for row, c in zip(errors, codes)], budget=budget,
                           reference_error=[row[c] for row, c in zip(errors, b.reference)], caps=b.caps,
                           energy=list(self.signals.energy),
                           **({"unsent": self.signals.fractions(self.groups)}
                              if isinstance(self.signals, GroupErrors) else {}))
            compute = self.last["compute"] if measured is None else max(0.0, measured - self._exchange(times, ran))
            known = measured is not None or self.last["step"] > 0.0
            self.last = {"time": t, "ref_time": ref_t, "error": e, "ref_error": ref_e, "budget": budget,
                         "step": compute + t if known else 0.0, "measured_step": measured or 0.0,
                         "compute": compute}
        self.step_times = []
        return switched

    def _raises(self, g: int, old: int, new: int) -> bool:
        """Whether code ``new`` sends group ``g`` at a rank whose factor columns the group's recent steps did not
        project: a higher rank than ``old``'s, or any rank after dense (plain steps leave the warm start alone)."""
        ladder = self.groups[g].ladder
        if ladder[new].family != LOWRANK:
            return False
        return ladder[old].family != LOWRANK or float(ladder[new].value) > float(ladder[old].value)

    # ---- every step ---------------------------------------------------------------------------------------
    def decide(self, step: int, lr: float, force_dense: bool = False) -> StepDecision:
        """Track the agreed learning rate (a drop tightens the next decisions), then send the accepted codes."""
        step, lr = int(step), float(lr)
        if self._lr_dropped(lr):
            self.tight_until = max(self.tight_until, step + self.tight_steps)
            self.log_event(step, "auto_lr_drop", lr=lr, prev_lr=self.prev_lr, tight_until=self.tight_until)
        if math.isfinite(lr):
            self.prev_lr = lr
        raised = set(self.reproject) if step == self.reproject_step else set()
        if force_dense or all(g.ladder[c].family == DENSE or i in raised
                              for i, (g, c) in enumerate(zip(self.groups, self.codes))):
            return StepDecision(step=step, branch="dense", send_level=1.0, forced_dense=force_dense)
        levels = self._levels
        if raised:
            levels = {**levels, **{m: REPROJECT for i in sorted(raised) for m in self.groups[i].members}}
        send = 32.0 / REFERENCE[QSGD] if self.family == QSGD else REFERENCE[self.family]
        return StepDecision(step=step, branch="cand", send_level=send, layer_levels=levels)

    # ---- telemetry and state ------------------------------------------------------------------------------
    def telemetry(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"auto/level/{g.name}": float(g.ladder[c].value)      # rank, bits or CF; 0: dense
                               for g, c in zip(self.groups, self.codes)}
        ref_e = self.last["ref_error"]
        out.update({"auto/family_code": FAMILY_CODES[self.family], "auto/tight": int(self.tight),
                    "auto/decisions": self.decisions, "auto/hold": self.trial.hold,
                    "auto/predicted_exchange_s": self.last["time"], "auto/reference_exchange_s": self.last["ref_time"],
                    "auto/predicted_step_s": self.last["step"], "auto/measured_step_s": self.last["measured_step"],
                    "auto/error": self.last["error"], "auto/budget": self.last["budget"],
                    "auto/reference_error": ref_e,
                    "auto/error_ratio": self.last["error"] / ref_e if ref_e > 0 else 0.0})
        return out

    def levels_changed(self) -> None:
        """Re-derive the per-tensor levels from the codes (after a restore)."""
        self._levels = member_levels(self.groups, self.codes, PLAIN)

    def state_dict(self) -> dict[str, Any]:
        return auto_state_dict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_auto_state(self, state)


__all__ = ["AutoController", "PLAIN", "REPROJECT"]
