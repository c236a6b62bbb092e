"""The measured check on a mixed plan: the cost model's promise that a plan other than the reference is faster is a
trial, kept only while the measured steps keep it.

Why: the pricer adds per-group times (``timing.py``), but what a mixed plan costs on the core — more and smaller
buckets, a dense bf16 group beside low-rank ones, gloo's threads taking CPU from backward — is not additive. On
``resnet18_long`` at 100 Mbit/s ``auto`` alternated every 100–150 steps between rank 16 everywhere (measured
0.44–0.47 s) and mixed plans predicted 0.39–0.43 s that measured 0.45 s: each mixed interval missed its prediction,
the refit re-timed the link, the reference won, the next re-timing made the mixed plan look faster again — a switch
and a re-projection every few intervals for no measured gain (docs/algorithms.md §8).

So a quiet interval that ran a plan other than the reference is judged against the reference's last ``REF_KEPT``
quiet intervals (with none measured yet, the next quiet interval runs the reference once, as the control): unless
its median measured step is at least ``min_gain`` shorter than their median *and* no longer than the fastest of
them, the reference is held for the next ``hold`` quiet decisions (1, 2, 4, … up to ``hold_max``: a plan that keeps
failing is tried ever more rarely); a trial that pays resets the back-off. Why the fastest too: interval medians of
one plan wander by ±15% on a shared core (``resnet18_long`` at 1 Gbit/s: the reference's 50-step medians spanned
0.41–0.67 s), so a trial judged against one reference interval passes and fails on noise; a gain inside the
reference's own spread is not a measured gain. A link re-timed 2× slower or faster forgets the reference's steps and
any hold, so a changed link is re-planned at once. All inputs are agreed (the ranks' mean measured steps, the
broadcast phase and codes), so every rank holds the same state; rank 0 judges a copy at ``propose``, every rank the
same at ``accept``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

LINK_CHANGE = 2.0       # a re-timed all-reduce slope this factor off the last one: a changed link, start afresh
REF_KEPT = 3            # the reference's quiet intervals a trial is judged against


@dataclass
class TrialCheck:
    """See the module docstring. ``hold_max`` 0 switches the check off."""

    min_gain: float
    hold_max: int
    ref_steps: list[float] = field(default_factory=list)   # medians of the reference's last quiet intervals
    hold: int = 0               # quiet decisions left that keep the reference
    backoff: int = 1            # the next failed trial's hold
    link_b: float = 0.0         # the all-reduce's per-byte slope the reference's step was measured under

    @property
    def ref_step(self) -> float:
        """The reference's step: the median of its kept quiet intervals (0: none measured)."""
        return float(statistics.median(self.ref_steps)) if self.ref_steps else 0.0

    @property
    def holding(self) -> bool:
        return self.hold > 0       # judge never sets a hold with hold_max 0

    def judge(self, ran: Sequence[int], reference: Sequence[int], quiet: bool, measured: Optional[float]
              ) -> Optional[bool]:
        """After an interval that ran codes ``ran`` (``quiet``: under the quiet budget) and measured a median step
        ``measured``: remember the reference's step, or judge a trial. True: the trial failed (a hold begins);
        False: it paid; None: nothing to judge."""
        if self.hold_max <= 0 or not quiet or measured is None or not measured > 0.0:
            return None
        if list(ran) == list(reference):
            self.ref_steps = (self.ref_steps + [float(measured)])[-REF_KEPT:]
            return None
        if not self.ref_steps:          # no control measured yet (or a changed link): run the reference once
            self.hold = max(self.hold, 1)
            return None
        if measured > (1.0 - self.min_gain) * self.ref_step or measured > min(self.ref_steps):
            self.hold, self.backoff = self.backoff, min(2 * self.backoff, self.hold_max)
            return True
        self.backoff = 1
        return False

    def spend(self, quiet: bool) -> None:
        """A decision was made: a quiet one uses up one decision of a hold."""
        if quiet and self.hold > 0:
            self.hold -= 1

    def link_measured(self, slope_b: float) -> bool:
        """A re-timed link: forget the reference's step and any hold when its slope moved by ``LINK_CHANGE`` or
        more (True then)."""
        before, self.link_b = self.link_b, float(slope_b)
        if before > 0.0 and slope_b > 0.0 and max(slope_b / before, before / slope_b) >= LINK_CHANGE:
            self.ref_steps, self.hold, self.backoff = [], 0, 1
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"ref_steps": list(self.ref_steps), "hold": self.hold, "backoff": self.backoff, "link_b": self.link_b}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        old = float(state.get("ref_step", 0.0))       # a state saved before REF_KEPT kept one interval
        self.ref_steps = [float(t) for t in state.get("ref_steps", [old] if old > 0.0 else [])][-REF_KEPT:]
        self.hold = int(state.get("hold", 0))
        self.backoff = int(state.get("backoff", 1))
        self.link_b = float(state.get("link_b", 0.0))


__all__ = ["TrialCheck", "LINK_CHANGE", "REF_KEPT"]
