"""A run's wall time priced per kind of step: each kind at its median measured step, times how many steps of that
kind the run makes.

Why: one median step does not stand for a run whose steps differ in what they send. A static system that starts
dense, post-local SGD's averaging and local steps, and a controller's branches (GraVAC's dense / CF 10 / CF 20,
Accordion's per-layer patterns) all have steps of a few kinds, each with its own cost. The fidelity benchmark
prices all of them the same way, here; the callers only say which measured steps are of which kind.
"""
from __future__ import annotations

import statistics
from collections.abc import Hashable, Iterable, Mapping
from typing import Optional, TypedDict


class KindPrice(TypedDict):
    """The median measured step of one kind and how many measured steps it is the median of."""

    step_s: float
    n: int


def kind_prices(measured: Iterable[tuple[Hashable, float]]) -> dict[Hashable, KindPrice]:
    """Each kind's median step over the (kind, step seconds) pairs; a kind with no pair has no price."""
    times: dict[Hashable, list[float]] = {}
    for kind, step_s in measured:
        times.setdefault(kind, []).append(float(step_s))
    return {kind: KindPrice(step_s=statistics.median(t), n=len(t)) for kind, t in times.items()}


def priced_time(counts: Mapping[Hashable, int], prices: Mapping[Hashable, KindPrice]) -> Optional[float]:
    """The time of a run that makes ``counts[kind]`` steps of each kind, each at its kind's price, summed in the
    order of ``counts``; None when a kind it makes has no price."""
    if any(n and kind not in prices for kind, n in counts.items()):
        return None
    return sum(n * prices[kind]["step_s"] for kind, n in counts.items() if n)
