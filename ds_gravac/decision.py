"""What one step sends and measures (:class:`StepDecision`), the controllers' answer to the synchronizer.

Its own module, below both: controllers (``ds_gravac.adapt``) make decisions and the statistics of a step
(``ds_gravac.telemetry.stats``) carry the decision they were measured under.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Optional

MAX_PROBES = 11   # probe levels one step may measure, one statistics slot each: θ_min, θ_c and up to 9 refresh CFs


class Branch(str, enum.Enum):
    """What the compressible tensors send in one step (GraVAC's three branches; other controllers use two)."""

    DENSE = "dense"     # uncompressed (the compensated input g + r, and the memory is cleared)
    MIN = "min"         # GraVAC's fallback level θ_min
    CAND = "cand"       # the candidate level θ_c (static and Accordion always send "cand")

    def __str__(self) -> str:
        return self.value


BRANCH_CODES = {"dense": 0, "min": 1, "cand": 2}   # telemetry codes; index with str(branch)


@dataclass(frozen=True)
class StepDecision:
    """What step ``step`` sends and measures. Frozen: created once per step at the decision point."""

    step: int
    branch: Branch                                # plain strings ("dense", "min", "cand") are converted
    send_level: float                             # CF sent by compressible tensors (1.0 for dense)
    probe_levels: tuple[float, ...] = ()          # gains measured this step, one stats slot each
    layer_levels: Optional[Mapping[str, float]] = None   # per-tensor overrides (Accordion)
    deferred: bool = False                        # strict mode: branch chosen after the pre-send exchange
    forced_dense: bool = False                    # synchronizer-forced dense step (discovery / resume)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "branch", Branch(self.branch))
        except ValueError:
            raise ValueError(f"ds_gravac: unknown branch {self.branch!r}") from None
        if len(self.probe_levels) > MAX_PROBES:
            raise ValueError(f"ds_gravac: at most {MAX_PROBES} probe levels per step")

    @property
    def dense(self) -> bool:
        return self.branch == Branch.DENSE

    def level_for(self, name: str) -> float:
        if self.branch == Branch.DENSE:
            return 1.0
        if self.layer_levels is not None and name in self.layer_levels:
            return float(self.layer_levels[name])
        return float(self.send_level)


__all__ = ["BRANCH_CODES", "MAX_PROBES", "Branch", "StepDecision"]
