"""The error signals of ``mode: "auto"`` per group, from agreed statistics only: unsent energy over a low-rank
compressor (:class:`GroupErrors`); added variance over a quantizer, pooled unsent energy over a sparsifier
(:class:`GroupLevelErrors`).

Every step the statistics exchange carries, per group, what the low-rank aggregate applied (``sync/aggregate_gain.py``
with a ``GroupSpec``): ``‖x̄_g‖²`` and the prefix energies ``Σ_{k≤r} ‖c_k‖²`` of the averaged factors at every
ladder rank the step computed (all of them on a dense step, whose warm-start refresh projects the exact mean; the
ranks up to the one sent on a compressed step; none for a matrix sent plain). The unsent energy of rank r is
``‖x̄_g‖² − Σ_{k≤r} ‖c_k‖²``, as ``error_model.lowrank_unsent`` defines it.

Between two decisions the steps' values are summed; at a decision each group's mean energy (and the one of the
interval before, for Accordion's norm-change rule) and, per rank, the mean unsent *fraction* of the steps that
measured it are kept. A rank not measured in the interval keeps the fraction
of the last interval that measured it (a group sent at rank 4 learns nothing new about rank 16), applied to the
group's current energy; a rank never measured counts as unsending everything. All values are float64 sums in
step order of agreed numbers, so every rank holds the same ones.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from .error_model import residual_in_flight
from .ladder import LOWRANK, QSGD, Group



class GroupErrors:
    """Per group: the interval's sums, and the kept energy and unsent fractions per measured rank."""

    def __init__(self, groups: Sequence[Group], ranks: Sequence[int]) -> None:
        self.ranks = tuple(int(r) for r in ranks)
        self.count = len(groups)
        self.energy = [0.0] * self.count              # mean ‖x̄_g‖² of the last interval with samples
        self.measured = [False] * self.count
        self.previous = [-1.0] * self.count           # mean energy of the interval before (-1: none)
        self.frac = [[-1.0] * len(self.ranks) for _ in range(self.count)]    # -1: never measured
        self.worst = [[-1.0] * len(self.ranks) for _ in range(self.count)]   # largest fraction of any one step
        self._reset_sums()

    def _reset_sums(self) -> None:
        self.sum_energy = [0.0] * self.count
        self.n_energy = [0] * self.count
        self.sum_unsent = [[0.0] * len(self.ranks) for _ in range(self.count)]
        self.sum_den = [[0.0] * len(self.ranks) for _ in range(self.count)]

    def add(self, signals: Sequence[Any]) -> None:
        """One step's agreed ``GroupSignal`` per group."""
        if len(signals) != self.count:
            return
        for g, sig in enumerate(signals):
            den = float(sig.den)
            if not math.isfinite(den) or den < 0:
                continue
            self.sum_energy[g] += den
            self.n_energy[g] += 1
            for j, captured in enumerate(sig.prefix):
                if captured is not None and math.isfinite(float(captured)):
                    unsent = max(0.0, den - float(captured))       # clamped: ‖x̄_g‖² is sampled
                    self.sum_unsent[g][j] += unsent
                    self.sum_den[g][j] += den
                    if den > 0.0:
                        self.worst[g][j] = max(self.worst[g][j], min(1.0, unsent / den))

    def close_interval(self) -> None:
        """Fold the interval's sums into the kept energies and fractions (a decision point)."""
        for g in range(self.count):
            if self.n_energy[g]:
                self.previous[g] = self.energy[g] if self.measured[g] else -1.0
                self.energy[g] = self.sum_energy[g] / self.n_energy[g]
                self.measured[g] = True
            for j in range(len(self.ranks)):
                if self.sum_den[g][j] > 0:
                    self.frac[g][j] = min(1.0, self.sum_unsent[g][j] / self.sum_den[g][j])
        self._reset_sums()

    @property
    def ready(self) -> bool:
        """Every group has an energy (else nothing is known about some group: no plan)."""
        return all(self.measured)

    def norm_changes(self) -> list[float]:
        """Per group, Accordion's relative change of the norm between the last two intervals,
        ``|√E_k − √E_{k−1}| / √E_{k−1}`` of their mean energies (−1: not known, or a zero norm before)."""
        out = []
        for g in range(self.count):
            before, now = self.previous[g], self.energy[g]
            ok = self.measured[g] and before > 0.0
            out.append(abs(math.sqrt(now) - math.sqrt(before)) / math.sqrt(before) if ok else -1.0)
        return out

    def errors(self, groups: Sequence[Group], exact: Optional[Sequence[int]] = None) -> list[list[float]]:
        """The residual in flight of every rung of every ladder (``error_model.residual_in_flight``): 0 for dense
        and for a rank at or above the group's ``exact`` rank (> 0), ``E·u/(1 − u)`` for rank r otherwise, with
        ``u`` its unsent fraction and ``E`` the group's energy."""
        pos = {r: j for j, r in enumerate(self.ranks)}
        out = []
        for g, group in enumerate(groups):
            row = []
            for level in group.ladder:
                if level.family != LOWRANK or (exact and 0 < exact[g] <= level.value):
                    row.append(0.0)
                    continue
                f = self.frac[g][pos[int(level.value)]]
                row.append(residual_in_flight((1.0 if f < 0 else f) * self.energy[g], self.energy[g]))
            out.append(row)
        return out

    def exact_ranks(self, groups: Sequence[Group], fraction: float) -> list[int]:
        """Per group of 2-D weights (``Group.linear``), the smallest rank of its ladder whose fraction on *every*
        measured step so far is at most ``fraction`` (0: none; a ``fraction`` of 0 finds none). Every step, not
        the interval's ratio of sums: a rank bound holds on each step, while a few steps of large, nearly rank-1
        gradients dominate the sums (the LSTM's 2600 × 650 class over a 50-step dense start: 1.3·10⁻³ at rank 2
        by the sums, 0.25 on its first steps; held at rank 2, it ended outside the perplexity bound).
        Convolutions are left out: one whose output is 1 × 1 (ResNet's last stage on 32 × 32 inputs) is
        rank-bounded too, but ResNet trained within the bounds without the rule, which would send that stage at 4×
        rank 16's bytes. VGG16-bn's 4096 × 25088 and 4096 × 4096 classes (batch 64) measured 2·10⁻⁴ to 1.8·10⁻³ at
        rank 64 on dense steps (the fp32 projection onto a warm start that trails the batch), rank 32
        7–43%.
        Read once, from the dense start: under error feedback the fraction also holds the residual of earlier
        steps, which a rank equal to the gradient's rank bound does not send (VGG16-bn's classes at rank 64 reached
        8–33% in 50 steps)."""
        pos = {r: j for j, r in enumerate(self.ranks)}
        out = []
        for g, group in enumerate(groups):
            ranks = [int(lv.value) for lv in group.ladder if lv.family == LOWRANK and fraction > 0.0
                     and group.linear and 0.0 <= self.worst[g][pos[int(lv.value)]] <= fraction]
            out.append(min(ranks) if ranks else 0)
        return out

    def fractions(self, groups: Sequence[Group]) -> list[list[float]]:
        """Per group, the kept unsent fraction of each low-rank rung in ladder order (−1: never measured)."""
        pos = {r: j for j, r in enumerate(self.ranks)}
        return [[self.frac[g][pos[int(lv.value)]] for lv in group.ladder if lv.family == LOWRANK]
                for g, group in enumerate(groups)]

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"energy": list(self.energy), "measured": list(self.measured),
                "previous": list(self.previous), "frac": [list(r) for r in self.frac],
                "worst": [list(r) for r in self.worst],
                "sum_energy": list(self.sum_energy), "n_energy": list(self.n_energy),
                "sum_unsent": [list(r) for r in self.sum_unsent], "sum_den": [list(r) for r in self.sum_den]}

    def load_state_dict(self, state: Optional[Mapping[str, Any]]) -> None:
        if not state or len(state["energy"]) != self.count:
            return
        self.energy = [float(v) for v in state["energy"]]
        self.measured = [bool(v) for v in state["measured"]]
        self.previous = [float(v) for v in state.get("previous", [-1.0] * self.count)]
        self.frac = [[float(v) for v in r] for r in state["frac"]]
        self.worst = [[float(v) for v in r] for r in state.get("worst", self.frac)]   # older checkpoints: sums
        self.sum_energy = [float(v) for v in state["sum_energy"]]
        self.n_energy = [int(v) for v in state["n_energy"]]
        self.sum_unsent = [[float(v) for v in r] for r in state["sum_unsent"]]
        self.sum_den = [[float(v) for v in r] for r in state["sum_den"]]


class GroupLevelErrors:
    """Per group, for a family whose every level is measured on every step (QSGD's variance,
    ``sync/quant_variance.py``; a sparsifier's pooled unsent energy, ``sync/sparse_unsent.py``): the interval's
    mean energy of the averaged update and the mean error of every level. Nothing is carried over from older
    intervals."""

    def __init__(self, groups: Sequence[Group], family: str, cfs: Sequence[float]) -> None:
        self.family = family
        self.cfs = tuple(float(c) for c in cfs)
        self.count = len(groups)
        self.energy = [0.0] * self.count
        self.measured = [False] * self.count
        self.previous = [-1.0] * self.count
        self.level_error = [[0.0] * len(self.cfs) for _ in range(self.count)]
        self._reset_sums()

    def _reset_sums(self) -> None:
        self.sum_energy = [0.0] * self.count
        self.n_energy = [0] * self.count
        self.sum_error = [[0.0] * len(self.cfs) for _ in range(self.count)]

    def add(self, signals: Sequence[Any]) -> None:
        """One step's agreed signal per group (``energy``, ``per_level``); a group with a non-finite term is
        skipped."""
        if len(signals) != self.count:
            return
        for g, sig in enumerate(signals):
            terms = [float(sig.energy), *(float(v) for v in sig.per_level)]
            if len(terms) != 1 + len(self.cfs) or not all(math.isfinite(v) and v >= 0 for v in terms):
                continue
            self.sum_energy[g] += terms[0]
            self.n_energy[g] += 1
            for j, v in enumerate(terms[1:]):
                self.sum_error[g][j] += v

    def close_interval(self) -> None:
        for g in range(self.count):
            n = self.n_energy[g]
            if n:
                self.previous[g] = self.energy[g] if self.measured[g] else -1.0
                self.energy[g] = self.sum_energy[g] / n
                self.level_error[g] = [v / n for v in self.sum_error[g]]
                self.measured[g] = True
        self._reset_sums()

    @property
    def ready(self) -> bool:
        return all(self.measured)

    def signal(self) -> float:
        """``S``: the summed mean energy of the averaged update (group order)."""
        total = 0.0
        for e in self.energy:
            total += e
        return total

    norm_changes = GroupErrors.norm_changes

    def errors(self, groups: Sequence[Group]) -> list[list[float]]:
        """The error of every rung of every ladder: 0 for dense, the group's mean at the rung's CF (QSGD's b bits:
        CF 32/b) — added variance over QSGD; over a sparsifier its pooled unsent energy as a residual in flight
        (``error_model.residual_in_flight``)."""
        pos = {cf: j for j, cf in enumerate(self.cfs)}

        def rung(g: int, level: Any) -> float:
            if level.family != self.family:
                return 0.0
            value = self.level_error[g][pos[32.0 / level.value if level.family == QSGD else level.value]]
            return value if self.family == QSGD else residual_in_flight(value, self.energy[g])
        return [[rung(g, level) for level in group.ladder] for g, group in enumerate(groups)]

    def state_dict(self) -> dict[str, Any]:
        return {"energy": list(self.energy), "measured": list(self.measured), "previous": list(self.previous),
                "level_error": [list(r) for r in self.level_error], "sum_energy": list(self.sum_energy),
                "n_energy": list(self.n_energy), "sum_error": [list(r) for r in self.sum_error]}

    def load_state_dict(self, state: Optional[Mapping[str, Any]]) -> None:
        if not state or "level_error" not in state or len(state["energy"]) != self.count:
            return
        self.energy = [float(v) for v in state["energy"]]
        self.measured = [bool(v) for v in state["measured"]]
        self.previous = [float(v) for v in state["previous"]]
        self.level_error = [[float(v) for v in r] for r in state["level_error"]]
        self.sum_energy = [float(v) for v in state["sum_energy"]]
        self.n_energy = [int(v) for v in state["n_energy"]]
        self.sum_error = [[float(v) for v in r] for r in state["sum_error"]]


__all__ = ["GroupErrors", "GroupLevelErrors"]
