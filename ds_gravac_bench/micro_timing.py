"""Timing and byte-counting helpers of the micro-benchmark: medians over warm repeats (the machine is shared, so
single samples mean little) and the bytes a tensor or an object's tensors hold."""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Sequence

import torch


def stats(samples: Sequence[float]) -> dict[str, float]:
    """Median and 10th/90th percentiles (linear interpolation), seconds."""
    xs = sorted(samples)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"median": q(0.5), "p10": q(0.1), "p90": q(0.9), "n": len(xs)}


def timed(fn: Callable[[int], Any], repeats: int, prepare: Optional[Callable[[int], Any]] = None
          ) -> dict[str, float]:
    """Run ``fn(i)`` once as warm-up and ``repeats`` times; ``prepare(i)`` runs untimed before each call."""
    samples = []
    for i in range(repeats + 1):
        if prepare is not None:
            prepare(i)
        t0 = time.perf_counter()
        fn(i)
        dt = time.perf_counter() - t0
        if i > 0:
            samples.append(dt)
    return stats(samples)


def nbytes(t: Optional[torch.Tensor]) -> int:
    """Bytes of a tensor's elements; 0 for a buffer that was never allocated."""
    return 0 if t is None else t.numel() * t.element_size()


def held_tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors an object holds in its attributes (through dicts, lists and tuples; each storage once)."""
    seen: set[int] = set()
    total, stack = 0, [vars(obj)]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set)):
            stack.extend(v)
    return total
