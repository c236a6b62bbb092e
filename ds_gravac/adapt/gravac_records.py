"""GraVAC bookkeeping (R-numbers refer to docs/algorithms.md): per-CF gain and throughput records and the candidate sequence.

Everything is plain Python float64 so that every rank, fed the same agreed stats, computes bit-identical
records; (de)serialisation is JSON-friendly and exact (``repr`` of a float round-trips).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional


class Phase(str, enum.Enum):
    """Where the CF search stands (the search advances only at window boundaries)."""

    WARMUP = "WARMUP"           # before i0: dense steps, records warm up
    SEARCH = "SEARCH"           # a candidate θ_c is evaluated per window
    SETTLED = "SETTLED"         # two best throughputs within ω: θ_c fixed at the lower CF
    EXHAUSTED = "EXHAUSTED"     # θ_c reached θ_max (or no candidate above θ_min exists)

    def __str__(self) -> str:
        return self.value


def ewma(prev: float, sample: float, alpha: float, first: bool) -> float:
    """``x̄ = α·x + (1−α)·x̄``, seeded with the first sample (no bias towards zero)."""
    return float(sample) if first else alpha * float(sample) + (1.0 - alpha) * prev


def safe_ratio(num: float, den: float) -> float:
    """Gain of one sample; δ := 1 when the denominator is 0 (nothing to lose)."""
    return num / den if den > 0.0 else 1.0


@dataclass
class GainRecord:
    """``{num̄, den̄, ratio̅, count, last_step}`` of one CF, updated only at steps that evaluated it."""

    num: float = 0.0
    den: float = 0.0
    ratio: float = 0.0
    count: int = 0
    last_step: int = -1

    def update(self, num: float, den: float, alpha: float, step: int) -> float:
        """Add one step's pooled sample; returns the raw per-step gain (for telemetry)."""
        raw = safe_ratio(num, den)
        first = self.count == 0
        self.num = ewma(self.num, num, alpha, first)
        self.den = ewma(self.den, den, alpha, first)
        self.ratio = ewma(self.ratio, raw, alpha, first)
        self.count += 1
        self.last_step = int(step)
        return raw

    def gain(self, gain_ewma: str) -> Optional[float]:
        """δ̄ per ``gain_ewma`` (R1); ``None`` until one sample exists (R8: never passes ε)."""
        if self.count == 0:
            return None
        if gain_ewma == "ewma_of_ratio":
            return self.ratio
        return safe_ratio(self.num, self.den)

    def to_list(self, cf: float) -> list[Any]:
        return [cf, self.num, self.den, self.ratio, self.count, self.last_step]

    @classmethod
    def from_list(cls, row: Iterable[Any]) -> tuple[float, "GainRecord"]:
        cf, num, den, ratio, count, last = list(row)
        return float(cf), cls(float(num), float(den), float(ratio), int(count), int(last))


@dataclass
class ThroughputRecord:
    """``{T̄_sys, sent_count, last_sent_step}`` of one CF, updated only from steps that *sent* it."""

    t_sys: float = 0.0
    sent_count: int = 0
    last_sent_step: int = -1

    def update(self, t_sys: float, alpha: float, step: int) -> None:
        self.t_sys = ewma(self.t_sys, t_sys, alpha, self.sent_count == 0)
        self.sent_count += 1
        self.last_sent_step = int(step)

    def to_list(self, cf: float) -> list[Any]:
        return [cf, self.t_sys, self.sent_count, self.last_sent_step]

    @classmethod
    def from_list(cls, row: Iterable[Any]) -> tuple[float, "ThroughputRecord"]:
        cf, t_sys, count, last = list(row)
        return float(cf), cls(float(t_sys), int(count), int(last))


def records_to_rows(records: Mapping[float, Any]) -> list[list[Any]]:
    """Sorted rows: float CFs stay floats in JSON (dict keys would turn into strings)."""
    return [records[cf].to_list(cf) for cf in sorted(records)]


def rows_to_records(rows: Any, cls: Any) -> dict[float, Any]:
    """Inverse of :func:`records_to_rows`; also accepts ``{str(cf): row-without-cf}`` mappings."""
    out: dict[float, Any] = {}
    if isinstance(rows, Mapping):
        rows = [[float(k), *v] for k, v in rows.items()]
    for row in rows or []:
        cf, rec = cls.from_list(row)
        out[cf] = rec
    return out


# ---- candidate sequence --------------------------------------------------------------------------

def candidate_factor(policy: str, step_size: float, j: int) -> float:
    """``f_j``: exponential ``s^(2^(j−1))`` or geometric ``s^j``; +inf once it overflows."""
    exponent = 2.0 ** (j - 1) if policy == "exponential" else float(j)
    try:
        return math.pow(step_size, exponent)
    except OverflowError:
        return math.inf


class CandidateSequence:
    """``θ_c(j) = realize(min(θ_max, θ_min0·f_j))``, absolute in θ_min0 so escalation never makes it jump (R2)."""

    def __init__(self, theta_min0: float, theta_max: float, policy: str, step_size: float,
                 realize: Callable[[float], float]) -> None:
        self.theta_min0 = float(theta_min0)
        self.theta_max = float(theta_max)
        self.policy = policy
        self.step_size = float(step_size)
        self.realize = realize
        self._memo: dict[float, Optional[tuple[int, float]]] = {}

    def cf(self, j: int) -> tuple[float, bool]:
        """Realized CF of index j and whether the unsnapped value hit θ_max (end of the sequence)."""
        raw = min(self.theta_max, self.theta_min0 * candidate_factor(self.policy, self.step_size, j))
        return float(self.realize(raw)), raw >= self.theta_max

    def after(self, floor: float) -> Optional[tuple[int, float]]:
        """Smallest ``(j, θ_c(j))`` with ``θ_c(j) > floor``; ``None`` when the sequence is exhausted."""
        floor = float(floor)
        if floor not in self._memo:
            found: Optional[tuple[int, float]] = None
            j = 1
            while True:
                cf, capped = self.cf(j)
                if cf > floor:
                    found = (j, cf)
                    break
                if capped:
                    break
                j += 1
            self._memo[floor] = found
        return self._memo[floor]
