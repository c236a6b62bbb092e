"""The fixed-length per-step stats vector exchanged on ch0, and the per-step record users see.

One layout for every mode and step, so the control collective is identical every step (gravac.md §4.3 step 5).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MAX_PROBES = 11   # θ_min, θ_c and up to 9 refresh CFs (gravac.md §4.3 step 5)

SUM_FIELDS = ("den", "den_raw") + tuple(f"num{j}" for j in range(MAX_PROBES)) + (
    "values_sent", "bytes_sent", "nonfinite", "t_iter_prev", "t_gain_prev")
TIME_FIELDS = ("stage_s", "compress_s", "decompress_s", "comm_wait_s", "writeback_s", "finish_s")
FIELDS = SUM_FIELDS + TIME_FIELDS
INDEX = {name: i for i, name in enumerate(FIELDS)}
LENGTH = len(FIELDS)


def pack(values: dict[str, float], nums: list[float]) -> torch.Tensor:
    vec = torch.zeros(LENGTH, dtype=torch.float64)
    for name, v in values.items():
        vec[INDEX[name]] = float(v)
    for j, v in enumerate(nums[:MAX_PROBES]):
        vec[INDEX[f"num{j}"]] = float(v)
    return vec


@dataclass(frozen=True)
class Reduced:
    """Rank-order sums (agreed) and maxima (telemetry) of one step's gathered vectors."""

    sums: dict[str, float]
    maxima: dict[str, float]
    nums: tuple[float, ...]


def reduce_rows(rows: torch.Tensor, num_probes: int) -> Reduced:
    """Sum rows in rank order in Python float64: identical on every rank (I3 for control values)."""
    data = rows.tolist()
    sums = {name: 0.0 for name in FIELDS}
    maxima = {name: float("-inf") for name in TIME_FIELDS + ("t_iter_prev",)}
    for row in data:
        for name, i in INDEX.items():
            sums[name] += row[i]
        for name in maxima:
            maxima[name] = max(maxima[name], row[INDEX[name]])
    nums = tuple(sums[f"num{j}"] for j in range(num_probes))
    return Reduced(sums=sums, maxima=maxima, nums=nums)


def step_record(**fields: Any) -> dict[str, Any]:
    """The user-facing record of one optimizer step (architecture.md §7 names plus spec metric names)."""
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
