"""The typed plan of one step: what every bucket does, fixed at the decision point from agreed values only."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ..compress.base import stable_hash

if TYPE_CHECKING:
    from ..decision import StepDecision


class ActionKind(enum.Enum):
    """How one bucket travels in one step."""

    DENSE = "dense"          # DeepSpeed-exact all-reduce (of g for dense-classified buckets, of x = g + r else)
    COMPRESS = "compress"    # encoded at ``levels``, exchanged with the compressor's pattern
    DEFERRED = "deferred"    # strict decision: staged and measured now, its action is chosen after the pre-send
    #                          statistics exchange, still before anything of the bucket is launched


@dataclass(frozen=True)
class BucketAction:
    kind: ActionKind
    levels: tuple[float, ...] = ()      # per member, only for COMPRESS
    exchange: str = ""                  # pattern name chosen by the planner; "" = the compressor's own
    chunks: int = 1                     # pipeline chunks of a compressed bucket (cost model), each a collective
    # the cost model's predicted (dense, compressed) seconds: telemetry only, never compared or hashed
    predicted: Optional[tuple[float, float]] = field(default=None, compare=False)

    @property
    def compressed(self) -> bool:
        return self.kind is ActionKind.COMPRESS


DENSE = BucketAction(ActionKind.DENSE)
DEFERRED = BucketAction(ActionKind.DEFERRED)


def compress(levels: tuple[float, ...], exchange: str = "",
             predicted: Optional[tuple[float, float]] = None, chunks: int = 1) -> BucketAction:
    return BucketAction(ActionKind.COMPRESS, tuple(float(v) for v in levels), exchange, int(chunks), predicted)


@dataclass(frozen=True)
class StepPlan:
    """The controller's decision turned into one action per bucket (plan order) and the levels to measure."""

    step: int
    decision: "StepDecision"               # the controller's decision (frozen)
    probes: tuple[float, ...]              # realized levels whose gains are measured, one stats slot each
    actions: tuple[BucketAction, ...]
    phase: int = 0                         # the compressor's layout phase this step (ACP-SGD's P/Q parity)

    def digest(self) -> int:
        """63-bit hash of everything that selects a collective this step (for ``debug.check_plans``)."""
        parts = [str(self.step), str(self.decision.branch), repr(self.probes), str(self.phase)]
        parts += [f"{a.kind.value}:{a.levels!r}" + (f"@{a.exchange}" if a.exchange else "")
                  + (f"/{a.chunks}" if a.chunks > 1 else "") for a in self.actions]
        return stable_hash("|".join(parts))

    def with_actions(self, decision: "StepDecision", actions: tuple[BucketAction, ...]) -> "StepPlan":
        return StepPlan(self.step, decision, self.probes, actions, self.phase)
