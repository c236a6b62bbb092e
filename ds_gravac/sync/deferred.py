"""Device scalars of a step, read on the host once: the sums of ``‖x‖²`` and ``‖C(x)‖²`` and the non-finite checks.

Staging and encoding produce these as 0-d tensors on the gradients' device. Reading each as it is made
(``float(t)``) would stop a GPU once per bucket and probe level; instead they stay tensors, are added on the device
in the order the host would have added them, and :func:`resolve` reads every one of them in a single transfer
right before the statistics exchange, which needs them anyway (the non-finite agreement travels in it). The sums
are float64 additions in the same order as before, so the values are bitwise those of the per-call reads.
"""
from __future__ import annotations

import math
from typing import Union

import torch

from ..telemetry.stats import StepStats

Scalar = Union[float, torch.Tensor]


def scalar(v: Scalar) -> Scalar:
    """A float64 0-d tensor (a device value, not read) or a float: what the step's sums accept."""
    return v.double() if isinstance(v, torch.Tensor) else float(v)


def resolve(st: StepStats) -> None:
    """Turn ``st``'s tensor sums into floats and apply its deferred non-finite checks, in one device-to-host
    transfer per device (one in practice)."""
    parts: list[torch.Tensor] = []

    def take(v: Scalar) -> Union[int, float]:
        if isinstance(v, torch.Tensor):
            parts.append(v.reshape(-1))
            return len(parts) - 1
        return -1

    slots = {"den": take(st.den), "den_raw": take(st.den_raw)}
    num_slots = [take(v) for v in st.nums]
    check_slots = [take(values) for _, values, _ in st.checks]
    if not parts:
        st.checks.clear()
        return
    values = _read(parts)
    for name, i in slots.items():
        if i >= 0:
            setattr(st, name, values[i][0])
    st.nums = [values[i][0] if i >= 0 else v for i, v in zip(num_slots, st.nums)]
    for (members, _, per_member), i in zip(st.checks, check_slots):
        vals = values[i]
        if per_member:
            marked = [m for m, v in zip(members, vals) if not math.isfinite(v)]
        else:
            marked = members if not all(math.isfinite(v) for v in vals) else []
        for m in marked:
            st.mark_nonfinite(m)
    st.checks.clear()


def _read(parts: list[torch.Tensor]) -> list[list[float]]:
    """The values of ``parts`` (1-D float64 tensors) as lists, with one transfer per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(parts):
        by_device.setdefault(t.device, []).append(i)
    out: list[list[float]] = [[] for _ in parts]
    for idx in by_device.values():
        flat = torch.cat([parts[i] for i in idx]).tolist()        # the step's one host synchronization
        pos = 0
        for i in idx:
            n = parts[i].numel()
            out[i] = flat[pos:pos + n]
            pos += n
    return out


__all__ = ["Scalar", "scalar", "resolve"]
