"""What the step's completion, its record and the synchronizer's checkpoint read of the synchronizer.

``complete_step``, ``step_record_of``, ``sync_state_dict`` and ``load_sync_state`` take the synchronizer's parts
through this protocol, so they do not import the synchronizer (which calls them): the list below is exactly what
they may touch."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:
    from ..adapt.base import Controller
    from ..compress.base import Compressor
    from ..config import GravacConfig
    from .aggregate_gain import AggregateGain
    from .quant_variance import QuantVariance
    from .sparse_unsent import SparseUnsent
    from .buckets import BucketPlan, Member
    from .codec import BucketCodec
    from .collectives import Channels
    from .memory import ErrorFeedbackMemory
    from .planner import Planner
    from .reduce_rule import ReduceRule
    from .running_step import RunningStep
    from .server_memory import ServerResiduals
    from .statistics import StepStatistics
    from .update_space import UpdateSpace


class SyncParts(Protocol):
    """The synchronizer's parts a finished step works with (``Synchronizer`` is the implementation)."""

    config: "GravacConfig"
    comp: "Compressor"
    controller: "Controller"
    channels: "Channels"
    members: "list[Member]"
    memory: "ErrorFeedbackMemory"
    update_space: "UpdateSpace"
    partitioned: bool
    server: "ServerResiduals"
    planner: "Planner"
    rule: "ReduceRule"
    running: "Optional[RunningStep]"
    aggregate: "Optional[AggregateGain | QuantVariance | SparseUnsent]"
    sampled: "Optional[AggregateGain | QuantVariance | SparseUnsent]"      # the aggregate on a sampled step
    stats: "StepStatistics"
    world_size: int
    numel_total: int

    @property
    def plan(self) -> "BucketPlan": ...

    @property
    def codecs(self) -> "dict[int, BucketCodec]": ...

    def rebuild(self, order: list[int]) -> None: ...


__all__ = ["SyncParts"]
