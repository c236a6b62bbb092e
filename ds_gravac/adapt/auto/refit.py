"""When ``auto`` re-times the link: a measured step off its prediction in the same direction at two decisions in a
row.

Each decision predicts the next interval's step (the compute term re-fitted from the last interval, plus the new
plan's exchange). One interval off by more than ``refit_tolerance`` is the ±15% wander of 50-step medians on a
shared core, and a re-timing costs a step's time; a miss that persists over two decisions is the network or the
core having changed. Every input is agreed (the interval's median step, the prediction), so every rank re-times at
the same decision.
"""
from __future__ import annotations

from typing import Optional


class StepOffRule:
    """The sign of the last decision's miss (+1 slower than predicted, −1 faster, 0 within tolerance)."""

    def __init__(self, tolerance: Optional[float]) -> None:
        self.tolerance = tolerance
        self.sign = 0

    def off(self, measured: Optional[float], predicted: float) -> Optional[float]:
        """measured / predicted when it is off by more than the tolerance, else None."""
        if self.tolerance is None or measured is None or not predicted > 0.0:
            return None
        ratio = measured / predicted
        return ratio if abs(ratio - 1.0) > float(self.tolerance) else None

    def persistent(self, off: Optional[float]) -> bool:
        """Record this decision's miss; True when the last decision missed in the same direction."""
        sign = 0 if off is None else (1 if off > 1.0 else -1)
        repeated, self.sign = sign != 0 and sign == self.sign, sign
        return repeated

    def restart(self) -> None:
        """A re-timed link starts a new pair."""
        self.sign = 0


__all__ = ["StepOffRule"]
