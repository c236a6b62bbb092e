"""Controller contract: a controller only *decides*; the synchronizer carries it out.

Decisions are pure functions of agreed values (config, step, learning rate, replicated state, exchanged stats),
so every rank takes the same branch and launches the same collectives.
"""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..config import GravacConfig
from ..compress.base import stable_hash
from ..compress.kinds import GainKind, LevelKind, Multilevel
from ..decision import BRANCH_CODES, MAX_PROBES, Branch, StepDecision
from ..telemetry.stats import AgreedStats


@dataclass(frozen=True)
class ControllerContext:
    """Static facts given to a controller once the bucket plan is frozen."""

    world_size: int
    samples_per_step: int                         # b = micro batch × gas (per worker)
    realize_cf: Callable[[float], float]
    cf_grid: Optional[Sequence[float]]
    multilevel: Multilevel
    gain_kind: GainKind
    level_kind: LevelKind
    compressible: tuple[str, ...] = ()            # compressible tensor names in plan order
    rank: int = 0
    default_level: Optional[float] = None         # static: a low-rank rank, or a quantizer's default CF
    cost_fits: Optional[Callable[[], Any]] = None   # the agreed cost-model fits (a FitTable) or None (auto)
    measure_link: Optional[Callable[[], Any]] = None   # collective: time the link now, agreed fits (auto)
    dense_bytes_per_element: int = 4              # what a dense bucket sends per value (its communication dtype)


EVENTS_KEPT = 256     # controller events kept for pop_events(); older ones are dropped (bounded memory)


class Controller:
    """Base controller: static decisions, no stats needed. Subclasses override what they use."""

    mode: str = "static"

    def __init__(self, config: GravacConfig) -> None:
        self.config = config
        self.ctx: Optional[ControllerContext] = None
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS_KEPT)

    def bind(self, ctx: ControllerContext) -> None:
        self.ctx = ctx

    # ---- decisions --------------------------------------------------------------------------------
    def decide(self, step: int, lr: float, force_dense: bool = False) -> StepDecision:
        raise NotImplementedError

    def resolve(self, decision: StepDecision, stats: AgreedStats) -> StepDecision:
        """Strict mode: final decision once this step's gains are agreed."""
        return decision

    def observe(self, stats: AgreedStats) -> None:
        """Apply one step's agreed stats (pipelined: at the next decision point)."""

    def measures(self, step: int) -> bool:
        """Whether this step's signals are measured (the statistics' per-group terms; over low rank also a dense
        step's power iteration): every step, unless a controller samples fewer. A function of the step and agreed
        state, so every rank answers alike."""
        return True

    @property
    def strict(self) -> bool:
        return False

    def signal_groups(self, named_shapes: Sequence[tuple[str, Sequence[int]]]) -> Any:
        """Groups of the compressed tensors whose signals the statistics should carry per group (a
        ``sync.aggregate_gain.GroupSpec``), or None. Called by the synchronizer before its first plan."""
        return None

    # ---- rank-0 decisions (Accordion) -------------------------------------------------------------
    def collects_gradients(self, step: int) -> bool:
        """Whether the synchronizer should hand local uncompressed gradients to :meth:`collect` this step."""
        return False

    def collect(self, name: str, grad: torch.Tensor) -> None:
        """Local gradient of one compressible tensor (rank-local; used only for rank-0 proposals)."""

    def broadcast_point(self, step: int) -> bool:
        """Whether ``step``'s decision needs rank 0's proposal broadcast on ch0 before it is made."""
        return False

    def before_proposal(self, step: int) -> None:
        """Every rank, at a broadcast point, before rank 0 proposes (nothing is in flight): a controller may run
        agreed measurements here (auto re-times the link)."""

    def propose(self, step: int, lr: float) -> torch.Tensor:
        """Rank 0 only: an int64 tensor of fixed length ``proposal_size()``."""
        raise NotImplementedError

    def proposal_size(self) -> int:
        return 1

    def accept(self, step: int, proposal: torch.Tensor) -> set[str]:
        """Every rank: apply rank 0's broadcast proposal; returns the tensors whose level changed."""
        return set()

    # ---- telemetry and state ----------------------------------------------------------------------
    def telemetry(self) -> dict[str, Any]:
        return {}

    def log_event(self, step: int, kind: str, **fields: Any) -> None:
        self._events.append({"step": step, "event": kind, **fields})

    def pop_events(self) -> list[dict[str, Any]]:
        events = list(self._events)
        self._events.clear()
        return events

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore replicated state exactly."""

    def replicated_state(self) -> dict[str, Any]:
        """The part of the state every rank must hold identically (default: all of it)."""
        return self.state_dict()

    def state_checksum(self) -> int:
        """52-bit digest of the replicated state (exact in float64) for ``agreement_check_interval``."""
        return stable_hash(json.dumps(self.replicated_state(), sort_keys=True, default=str)) >> 11


# the decision types live in ds_gravac.decision; importable from here as before
__all__ = ["AgreedStats", "BRANCH_CODES", "Branch", "Controller", "ControllerContext", "MAX_PROBES", "StepDecision"]
