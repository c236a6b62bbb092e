"""The only module that issues collectives (through ``deepspeed.comm``), on three channels created in a
fixed order on every rank: ch0 control, ch1 first-round data, ch2 second-round data (synchronization.md §2)."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from deepspeed import comm as dist

from ..errors import GravacError

# torch 2.14 deprecates the name all_gather_into_tensor in favour of all_gather_single, but deepspeed.comm (the
# interface we must use) still calls it; the warning would print on every step of every run.
warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)


@dataclass
class Work:
    """An in-flight collective with its launch time; ``finish_t`` is set when it was waited for."""

    handle: Any
    launch_t: float
    nbytes: int
    finish_t: Optional[float] = None

    def wait(self) -> float:
        """Block until done; returns the seconds spent blocked."""
        t0 = time.perf_counter()
        if self.handle is not None:
            self.handle.wait()
        self.finish_t = time.perf_counter()
        return self.finish_t - t0


@dataclass
class Channels:
    """Process groups over all ranks; our own groups keep user collectives out of our issue order."""

    world_size: int
    rank: int
    groups: list[Any] = field(default_factory=list)

    @classmethod
    def create(cls) -> "Channels":
        n = dist.get_world_size()
        groups = [dist.new_group(ranks=list(range(n))) for _ in range(3)]
        return cls(world_size=n, rank=dist.get_rank(), groups=groups)

    @property
    def control(self) -> Any:
        return self.groups[0]

    @property
    def data(self) -> Any:
        return self.groups[1]

    @property
    def data2(self) -> Any:
        return self.groups[2]


def _nonempty(t: torch.Tensor, what: str) -> None:
    if t.numel() == 0:
        raise GravacError(f"ds_gravac: refusing to issue an empty {what} (gloo hangs on empty inputs)")


def all_reduce_async(t: torch.Tensor, group: Any) -> Work:
    _nonempty(t, "all_reduce")
    t0 = time.perf_counter()
    return Work(dist.all_reduce(t, group=group, async_op=True), t0, t.numel() * t.element_size())


def all_gather_async(out: torch.Tensor, t: torch.Tensor, group: Any) -> Work:
    _nonempty(t, "all_gather")
    t0 = time.perf_counter()
    return Work(dist.all_gather_into_tensor(out, t, group=group, async_op=True), t0,
                t.numel() * t.element_size())


def broadcast(t: torch.Tensor, src: int, group: Any) -> None:
    _nonempty(t, "broadcast")
    dist.broadcast(t, src=src, group=group)


def agree_min_max(values: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """MIN and MAX over ranks of an int64/float64 vector (attach hash, agreement checks)."""
    lo = values.clone()
    hi = values.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    return lo, hi


def check_agreement(value: int, group: Any, what: str) -> None:
    """Raise on every rank if ranks hold different 63-bit values (e.g. config hash, plan hash)."""
    lo, hi = agree_min_max(torch.tensor([value], dtype=torch.int64), group)
    if int(lo.item()) != int(hi.item()):
        raise GravacError(f"ds_gravac: {what}")


def ring_allreduce_bytes(payload_bytes: int, world_size: int) -> float:
    """Logical bytes one rank sends in a ring all-reduce of ``payload_bytes`` (synchronization.md §10)."""
    return 2.0 * (world_size - 1) / world_size * payload_bytes


def allgather_bytes(payload_bytes: int, world_size: int) -> float:
    return float((world_size - 1) * payload_bytes)
