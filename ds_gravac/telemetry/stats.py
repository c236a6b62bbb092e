"""The per-step statistics: what each rank accumulates, the fixed-length vector the ranks exchange every step,
and the record users see.

One vector layout for every mode and step, so the control collective is identical every step. Sums (pooled
gains, bytes, the non-finite count) are added in rank order in Python float64, so every rank holds bit-identical
values to decide from; a few fields are read per rank (rank 0's learning rate, each rank's first non-finite
tensor); the phase timings travel one step late (the vector is exchanged before the step's last phases end) and
serve telemetry only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from ..decision import MAX_PROBES, StepDecision

Scalar = Union[float, torch.Tensor]    # a device value not read yet (ds_gravac.sync.deferred), or a float


SUM_FIELDS = ("den", "den_raw") + tuple(f"num{j}" for j in range(MAX_PROBES)) + (
    "values_sent", "bytes_sent", "nonfinite", "t_iter_prev", "t_gain_prev")
RANK_FIELDS = ("nonfinite_first", "lr")
TIME_FIELDS = ("stage_s", "compress_s", "decompress_s", "comm_wait_s", "writeback_s", "finish_s")
FIELDS = SUM_FIELDS + RANK_FIELDS + TIME_FIELDS
INDEX = {name: i for i, name in enumerate(FIELDS)}
LENGTH = len(FIELDS)


@dataclass
class StepStats:
    """One rank's accumulators for the running step."""

    den: Scalar = 0.0                # Σ ‖x‖² (compensated inputs; dense-classified tensors: ‖g‖²)
    den_raw: Scalar = 0.0            # Σ ‖g‖²
    nums: list[Scalar] = field(default_factory=list)    # Σ ‖C_θ(x)‖² per probe slot
    values_sent: int = 0
    bytes_sent: float = 0.0
    nonfinite: int = 0               # tensors with a NaN/Inf in their compressor input (or gradient)
    nonfinite_first: int = -1        # lowest member index (registration order) among them
    compress_s: float = 0.0
    probe_s: float = 0.0
    stage_s: float = 0.0
    # deferred non-finite checks: (member indices, their ‖x‖² or one bucket ‖g‖², per member?) — read on the host
    # with the sums above, in one transfer before the statistics exchange (ds_gravac.sync.deferred)
    checks: list[tuple[list[int], torch.Tensor, bool]] = field(default_factory=list)

    def add_nums(self, nums: list[Scalar]) -> None:
        if len(self.nums) < len(nums):
            self.nums.extend([0.0] * (len(nums) - len(self.nums)))
        for j, v in enumerate(nums):
            self.nums[j] += v

    def mark_nonfinite(self, member_index: int) -> None:
        self.nonfinite += 1
        if self.nonfinite_first < 0 or member_index < self.nonfinite_first:
            self.nonfinite_first = member_index


def pack(values: dict[str, float], nums: list[float]) -> torch.Tensor:
    vec = torch.zeros(LENGTH, dtype=torch.float64)
    for name, v in values.items():
        vec[INDEX[name]] = float(v)
    for j, v in enumerate(nums[:MAX_PROBES]):
        vec[INDEX[f"num{j}"]] = float(v)
    return vec


@dataclass(frozen=True)
class AgreedStats:
    """Cross-rank sums of one step's stats vector (identical on every rank)."""

    step: int
    decision: StepDecision         # the controller's decision of that step
    den: float                      # Σ_w ‖g_ef‖² over the model
    den_raw: float                  # Σ_w ‖g‖² (no residual), for gain_denominator "raw"
    nums: tuple[float, ...]         # Σ_w ‖C_θ(g_ef)‖² per probe slot (dense-classified tensors count fully)
    t_iter_prev: float              # mean over ranks of t_iter(step − 1); 0 if unknown
    t_gain_prev: float              # mean over ranks of the gain-computation time of step − 1
    values_sent: float
    bytes_sent: float
    nonfinite: float
    world_size: int
    lr: float = math.nan            # rank 0's learning rate of this step (the agreed value controllers may use)
    nonfinite_first: tuple[float, ...] = ()   # per rank: first tensor (member index) with a NaN/Inf, or -1
    aggregate: Any = None           # gain_denominator "aggregate": the previous step's AggregateSample, or None


@dataclass(frozen=True)
class Reduced:
    """Rank-order sums (agreed), per-rank columns and maxima (telemetry) of one step's gathered vectors."""

    sums: dict[str, float]
    maxima: dict[str, float]
    nums: tuple[float, ...]
    per_rank: dict[str, list[float]]


def reduce_rows(rows: torch.Tensor, num_probes: int) -> Reduced:
    """Sum rows in rank order in Python float64: identical on every rank."""
    data = rows.tolist()
    sums = {name: 0.0 for name in SUM_FIELDS}
    maxima = {name: float("-inf") for name in TIME_FIELDS + ("t_iter_prev",)}
    for row in data:
        for name in SUM_FIELDS:
            sums[name] += row[INDEX[name]]
        for name in maxima:
            maxima[name] = max(maxima[name], row[INDEX[name]])
    per_rank = {name: [row[INDEX[name]] for row in data] for name in RANK_FIELDS}
    nums = tuple(sums[f"num{j}"] for j in range(num_probes))
    return Reduced(sums=sums, maxima=maxima, nums=nums, per_rank=per_rank)


def step_record(**fields: Any) -> dict[str, Any]:
    """The user-facing record of one optimizer step (short names plus the ``comm/*``, ``time/*`` metric names)."""
    rec = dict(fields)
    d = rec.get("numel_total", 0) or 0
    rec["cf"] = d / rec["values_sent"] if rec.get("values_sent") else 1.0
    payload = rec.get("payload_bytes") or 0
    rec["wire_cf"] = 4.0 * d / payload if payload else 1.0
    cn, cv = rec.get("compressed_numel", 0), rec.get("compressed_values", 0)
    rec["cf_compressed"] = cn / cv if cv else 1.0
    rec["comm/bytes_sent"] = rec["bytes_sent"]
    rec["comm/bytes_dense_equiv"] = rec["dense_bytes"]
    rec["comm/values_sent"] = rec["values_sent"]
    rec["comm/cf_realized"] = rec["cf"]
    rec["comm/wire_cf"] = rec["wire_cf"]
    for short, long in (("compress_s", "time/compress"), ("decompress_s", "time/decompress"),
                        ("comm_wait_s", "time/comm_wait"), ("stage_s", "time/stage"),
                        ("writeback_s", "time/writeback"), ("finish_s", "time/finish")):
        if short in rec:
            rec[long] = rec[short]
    return rec
