"""The selector ``config.selection`` names: above both ``selection`` (the rules) and ``cost_model`` (which builds on
them), so neither imports the other's user."""
from __future__ import annotations

from typing import Optional

from ..compress.base import Compressor
from ..config import GravacConfig
from .collectives import Channels
from .cost_model.model import CostModel
from .reduce_rule import ReduceRule
from .exchange.base import Exchange
from .selection import Selector, ThresholdSelector


def make_selector(config: GravacConfig, compressor: Compressor, pattern: type[Exchange], rule: ReduceRule,
                  world_size: int, channels: Optional[Channels] = None) -> Selector:
    """The strategy ``config.selection`` names (the cost model needs the channels to measure and agree)."""
    threshold = ThresholdSelector(config, pattern, rule, world_size)
    if config.selection != "cost_model" or channels is None or config.mode == "dense" or compressor.name == "none":
        return threshold                      # nothing is ever compressed: nothing to price
    return CostModel(config, compressor, rule, world_size, channels, threshold)


__all__ = ["make_selector"]
