"""Which compressible buckets are sent compressed, and with which exchange: the planner's selection strategy.

The planner asks its selector for a :class:`Choice` per (bucket, level tuple) and caches the answer per
``(bucket, levels, phase, selector.version)``; a selector bumps ``version`` when its answers may change (the
cost model after a refit). Answers must depend on agreed values only (config, N, the frozen bucket plan, the
levels, agreed fits), because they select collectives and payload sizes.

``selection: "threshold"`` is :class:`ThresholdSelector`; ``"cost_model"`` is
:class:`ds_gravac.sync.cost_model.model.CostModel`, which answers with these same rules until it has fits
(``selector_factory.make_selector`` builds the one the config names).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..config import GravacConfig
from .reduce_rule import ReduceRule

if TYPE_CHECKING:
    from .buckets import BucketPlan
    from .codec import BucketCodec
    from .exchange.base import Codec, Exchange
    from .running_step import RunningStep


@dataclass(frozen=True)
class Choice:
    """One bucket at one level tuple: dense or compressed, the exchange pattern, and the predicted seconds
    (NaN when the selector predicts nothing)."""

    dense: bool
    exchange: str = ""                  # pattern name; "" = the compressor's own pattern
    pred_dense_s: float = math.nan
    pred_compressed_s: float = math.nan
    chunks: int = 1                     # pipeline chunks of a compressed send (cost model only)


class PlannedBuckets(Protocol):
    """What a selector reads of the planner that asks it (``Planner`` is one): the frozen plan and its codecs."""

    @property
    def plan(self) -> "BucketPlan": ...

    @property
    def codecs(self) -> "dict[int, BucketCodec]": ...


class Selector(Protocol):
    version: int

    def choose(self, codec: "Codec", levels: tuple[float, ...]) -> Choice: ...

    def prepare(self, planner: PlannedBuckets) -> None: ...

    def after_step(self, run: "RunningStep", planner: PlannedBuckets, nonfinite: bool) -> dict[str, Any]: ...


class ThresholdSelector:
    """Static classification decides what is compressible; per step a bucket goes dense only when
    ``sparse_fallback`` is on and its pattern would move at least the bytes of the dense all-reduce."""

    version = 0

    def __init__(self, config: GravacConfig, pattern: "type[Exchange]", rule: ReduceRule, world_size: int) -> None:
        self.config, self.pattern, self.rule, self.world_size = config, pattern, rule, world_size

    def choose(self, codec: "Codec", levels: tuple[float, ...]) -> Choice:
        words = sum(p.words for p in codec.plans(levels))
        return Choice(self.config.sparse_fallback
                      and not self.pattern.pays(words, codec.bucket.numel, self.world_size, self.rule))

    def prepare(self, planner: PlannedBuckets) -> None:
        """Nothing to measure."""

    def after_step(self, run: "RunningStep", planner: PlannedBuckets, nonfinite: bool) -> dict[str, Any]:
        return {}
