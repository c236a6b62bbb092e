"""The state of the step in flight, from the decision point to the end of backward."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..telemetry.stats import StepStats
from .codec import SendLayout
from .exchange import Exchange
from .step_plan import StepPlan


@dataclass
class RunningStep:
    """Everything about the step in flight; created at the decision point, dropped at the end of backward."""

    plan: StepPlan
    pending: list[int]                                   # members not yet ready, per bucket
    next_b: int = 0                                      # first bucket not launched yet
    next_round_b: dict[int, int] = field(default_factory=dict)   # round r ≥ 1 → first bucket not advanced yet
    round_wait_s: float = 0.0                            # blocked on a round before issuing the next one
    stats: StepStats = field(default_factory=StepStats)
    exchanges: dict[int, Exchange] = field(default_factory=dict)
    held: list[Exchange] = field(default_factory=list)  # bulk: encoded in this hook, issued together after it
    layouts: dict[int, SendLayout] = field(default_factory=dict)      # compressed buckets' sent layouts
    staged: dict[int, list[torch.Tensor]] = field(default_factory=dict)   # strict mode: inputs awaiting launch
    launch_t: dict[int, float] = field(default_factory=dict)
    encode_s: dict[int, float] = field(default_factory=dict)   # compressed buckets: encode of the sent level
    decode_s: dict[int, float] = field(default_factory=dict)   # compressed buckets: the final decode
    t_begin: float = 0.0
    observed: bool = False                               # the controller has seen this step's statistics
    loss_scale: float = 1.0                              # fp16 loss scale of this backward (ZeRO-1/2), else 1
