"""The state of the step in flight, from the decision point to the end of backward."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
import torch

from ..telemetry.stats import StepStats
from .codec import SendLayout
from .collectives import Channels
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

    def issue_later_rounds(self, max_rounds: int, num_buckets: int, channels: Channels, block: bool) -> None:
        """Rounds after the first, strictly in plan order per round: round r runs on its own channel, so every
        rank issues the same sequence there whatever the timing. During backward (``block`` false) a bucket
        advances only once its previous round has completed and every earlier bucket has advanced; at the end
        of backward the rest follow, waiting where needed."""
        for r in range(1, max_rounds):
            b = self.next_round_b.get(r, 0)
            while b < num_buckets:
                ex = self.exchanges.get(b)
                if ex is None:
                    break                       # not launched yet
                if ex.rounds > r:
                    if ex.works[r - 1] is None or (not block and not ex.completed(r - 1)):
                        break                   # its previous round is not issued, or not done yet
                    self.round_wait_s += ex.wait(r - 1)
                    t0 = time.perf_counter()
                    ex.advance(r, channels)     # encodes the next round: codec time
                    self.stats.compress_s += time.perf_counter() - t0
                b += 1
            self.next_round_b[r] = b
