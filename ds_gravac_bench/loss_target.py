"""The loss target of a fidelity table: dense's smoothed loss at a fraction of the budget — unless that one point of
the smoothed curve is an excursion.

Why: the smoothed curve is an exponential average with a memory of about ten steps, and the per-step loss of the
long tasks is noisy (ResNet-18: ±0.35 per step on a plateau near 2.8). One point of it can sit far from where the
curve runs: on ``resnet18_long`` seed 2, dense's smoothed loss at step 5,400 is 3.070 while the curve around it runs
at 2.809 — a loss dense first reached at step 1,830 rather than near 3,300 (seeds 0 and 1) — so every system would
"reach dense's loss" in the early descent and steps to the target would say nothing. The point is judged against
the smoothed curve over a window centred on it (5% of the budget): when it lies more than ``EXCURSION_Z`` robust
standard deviations (1.4826 × the median absolute deviation) from the window's median, the median is the target and
the table says so. The kept tables of every other seed and task lie within 1.5 of it, so their targets are unchanged.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional

EXCURSION_Z = 3.0          # robust standard deviations between the point and its window's median
WINDOW_FRACTION = 0.05     # the window around the point, as a fraction of the budget


def loss_target(smoothed: list[float], fraction: float) -> tuple[float, Optional[dict[str, Any]]]:
    """The target and, when the point at ``fraction`` was an excursion and replaced by its window's median, what was
    replaced (``point``, ``median``, ``z``, the window's first and last step, 1-based)."""
    n = len(smoothed)
    i = max(0, int(fraction * n) - 1)
    point = smoothed[i]
    half = max(1, int(WINDOW_FRACTION * n)) // 2
    lo, hi = max(0, i - half), min(n, i + half + 1)
    window = smoothed[lo:hi]
    if len(window) < 3:
        return point, None
    median = statistics.median(window)
    spread = 1.4826 * statistics.median(abs(v - median) for v in window)
    if spread == 0.0:
        z = 0.0 if point == median else float("inf")
    else:
        z = (point - median) / spread
    if abs(z) <= EXCURSION_Z:
        return point, None
    return median, {"point": point, "median": median, "z": z, "window": [lo + 1, hi]}
