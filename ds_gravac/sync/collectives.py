"""The only module that issues collectives (through ``deepspeed.comm``), on three channels created in a
fixed order on every rank: ch0 control, ch1 first-round data, ch2 second-round data.

Every channel is a process group created with ``timeout_s``: a collective that a peer never joins (the peer was
stopped, hangs, or its network went away) fails after that many seconds with a :class:`GravacError` naming the
collective, instead of waiting for gloo's 30-minute default. ``deepspeed.comm.new_group`` takes no timeout, so the
groups come from ``torch.distributed.new_group`` (which is what deepspeed.comm's torch backend calls anyway); the
collectives themselves go through ``deepspeed.comm``."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional, Sequence

import torch
import torch.distributed as tdist
from deepspeed import comm as dist

from ..errors import GravacError

# torch 2.14 deprecates all_gather_into_tensor (which deepspeed.comm 0.19.8 calls) for all_gather_single, with a
# FutureWarning on every call; silencing it per call meant a catch_warnings() per all-gather on the hot path, which
# is not thread-safe and resets every module's once-only warning registry. Older torch has no all_gather_single
# and does not deprecate the other name: there deepspeed.comm's call is used.
_ALL_GATHER_SINGLE = getattr(tdist, "all_gather_single", None)


def _all_gather_into_tensor(out: torch.Tensor, t: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """All-gather ``t`` of every rank into ``out`` through the collective's current, non-deprecated name."""
    if _ALL_GATHER_SINGLE is not None:
        return _ALL_GATHER_SINGLE(out, t, group=group, async_op=async_op)
    return dist.all_gather_into_tensor(out, t, group=group, async_op=async_op)


def collective_failed(what: str, exc: BaseException) -> GravacError:
    """The error every rank sees when one of our collectives fails (timeout, dead peer, size mismatch)."""
    return GravacError(f"ds_gravac: collective {what} failed: {str(exc).strip().splitlines()[0] if str(exc) else exc!r}"
                       f" (a peer rank stopped responding, died, or issued a different collective; ds_gravac's "
                       f"collectives time out after the 'timeout_s' config key)")


# How long ``Work.wait`` gives a gloo worker thread to let go of a finished collective (normally microseconds).
RELEASE_DEADLINE_S = 1.0
release_timeouts = 0          # waits that gave up on that (tests assert it stays 0: our code holds no extra refs)


@dataclass
class Work:
    """An in-flight collective with its launch time; ``finish_t`` is set when it was waited for.

    ``tensors``/``counts`` (gloo only): the tensors handed to the collective and their reference counts before it.
    Gloo's worker thread drops its reference to a work a moment *after* marking it complete; if that reference is
    the last one, the work's tensors are freed on the worker thread, which needs the GIL — and when the interpreter
    is already shutting down (the step was the script's last), taking the GIL ends the thread inside C++ and the
    process aborts ("terminate called without an active exception"). So ``wait`` drops our handle and waits until
    the tensors are back at their counts, i.e. no backend thread holds anything of ours once ``wait`` returns."""

    handle: Any
    launch_t: float
    nbytes: int
    what: str = "collective"
    finish_t: Optional[float] = None
    tensors: Sequence[torch.Tensor] = ()
    counts: Sequence[int] = ()
    kind: str = ""                   # "all_reduce", "all_gather" or "all_to_all" (data collectives)
    blocked: Optional[bool] = None   # still running when waited for: then ``finish_t`` is its completion time

    def wait(self) -> float:
        """Block until done; returns the seconds spent blocked."""
        t0 = time.perf_counter()
        if self.handle is not None:
            self.blocked = not bool(self.handle.is_completed())
            try:
                self.handle.wait()
            except RuntimeError as exc:
                raise collective_failed(self.what, exc) from exc
            self.handle = None
            self._settle()
        self.finish_t = time.perf_counter()
        return self.finish_t - t0

    def _settle(self) -> None:
        """Wait (yielding the GIL) until the backend thread has released the finished work's tensors."""
        global release_timeouts
        start = None
        while any(t._use_count() > c for t, c in zip(self.tensors, self.counts)):
            now = time.perf_counter()
            start = start if start is not None else now
            if now - start > RELEASE_DEADLINE_S:
                release_timeouts += 1
                break
            time.sleep(0 if now - start < 1e-3 else 1e-4)       # yield the GIL and the core to that thread
        self.tensors = self.counts = ()

    def is_completed(self) -> bool:
        return self.handle is None or bool(self.handle.is_completed())


@dataclass
class Channels:
    """Process groups over all ranks; our own groups keep user collectives out of our issue order."""

    world_size: int
    rank: int
    groups: list[Any] = field(default_factory=list)

    @classmethod
    def create(cls, timeout_s: float) -> "Channels":
        import torch.distributed as tdist
        n = dist.get_world_size()
        timeout = timedelta(seconds=float(timeout_s))
        # the control channel carries host tensors (statistics, decisions, agreement hashes): on NCCL it is a gloo
        # group, so it never needs a device copy; the data channels use the default backend
        control = None if tdist.get_backend() == "gloo" else "gloo"
        groups = [tdist.new_group(ranks=list(range(n)), timeout=timeout, backend=b) for b in (control, None, None)]
        return cls(world_size=n, rank=dist.get_rank(), groups=groups)

    def release(self) -> None:
        """Destroy our groups (their gloo threads stop); a no-op once the default group is gone, which took them."""
        import torch.distributed as tdist
        groups, self.groups = self.groups, []
        if tdist.is_initialized():
            for group in groups:
                tdist.destroy_process_group(group)

    @property
    def control(self) -> Any:
        return self.groups[0]

    @property
    def data(self) -> Any:
        return self.groups[1]

    @property
    def data2(self) -> Any:
        return self.groups[2]

    @property
    def data_channels(self) -> list[Any]:
        """Round r of an exchange runs on ``data_channels[r]``."""
        return self.groups[1:]


def _nonempty(t: torch.Tensor, what: str) -> None:
    if t.numel() == 0:
        raise GravacError(f"ds_gravac: refusing to issue an empty {what} (gloo hangs on empty inputs)")


def _issue(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:
        raise collective_failed(what, exc) from exc


def _tracked(group: Any, *tensors: torch.Tensor) -> dict[str, Any]:
    """The tensors whose release ``Work.wait`` waits for — on gloo groups only (NCCL's watchdog thread keeps finished
    works for a while by design and frees them safely)."""
    import torch.distributed as tdist
    if not hasattr(torch.Tensor, "_use_count") or tdist.get_backend(group) != "gloo":
        return {}
    return {"tensors": tensors, "counts": [t._use_count() for t in tensors]}


def _launch(what: str, kind: str, fn: Any, group: Any, t: torch.Tensor, buffers: tuple[torch.Tensor, ...],
            *args: Any) -> Work:
    """Issue ``fn(*args, group=group, async_op=True)`` of the per-rank input ``t``; ``buffers`` are the tensors
    the collective holds."""
    t0 = time.perf_counter()
    tracked = _tracked(group, *buffers)
    return Work(_issue(what, fn, *args, group=group, async_op=True), t0, t.numel() * t.element_size(), what,
                kind=kind, **tracked)


def all_reduce_async(t: torch.Tensor, group: Any, what: str = "all_reduce") -> Work:
    _nonempty(t, "all_reduce")
    return _launch(what, "all_reduce", dist.all_reduce, group, t, (t,), t)


def all_gather_async(out: torch.Tensor, t: torch.Tensor, group: Any, what: str = "all_gather") -> Work:
    _nonempty(t, "all_gather")
    return _launch(what, "all_gather", _all_gather_into_tensor, group, t, (out, t), out, t)


def all_to_all_async(out: torch.Tensor, t: torch.Tensor, group: Any, what: str = "all_to_all") -> Work:
    """Equal splits only: row w of ``t`` goes to rank w, row w of ``out`` comes from rank w (both flat, N·rows)."""
    _nonempty(t, "all_to_all")
    return _launch(what, "all_to_all", dist.all_to_all_single, group, t, (out, t), out, t)


def broadcast(t: torch.Tensor, src: int, group: Any, what: str = "broadcast") -> None:
    _nonempty(t, "broadcast")
    _issue(what, dist.broadcast, t, src=src, group=group)


def agree_min_max(values: torch.Tensor, group: Any, what: str = "agreement check") -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
    """MIN and MAX over ranks of an int64/float64 vector (attach hash, agreement checks)."""
    lo = values.clone()
    hi = values.clone()
    _issue(what, dist.all_reduce, lo, op=dist.ReduceOp.MIN, group=group)
    _issue(what, dist.all_reduce, hi, op=dist.ReduceOp.MAX, group=group)
    return lo, hi


def check_agreement(value: int, group: Any, what: str) -> None:
    """Raise on every rank if ranks hold different 63-bit values (e.g. config hash, plan hash)."""
    lo, hi = agree_min_max(torch.tensor([value], dtype=torch.int64), group)
    if int(lo.item()) != int(hi.item()):
        raise GravacError(f"ds_gravac: {what}")


def ring_allreduce_bytes(payload_bytes: int, world_size: int) -> float:
    """Logical bytes one rank sends in a ring all-reduce of ``payload_bytes``."""
    return 2.0 * (world_size - 1) / world_size * payload_bytes


def allgather_bytes(payload_bytes: int, world_size: int) -> float:
    return float((world_size - 1) * payload_bytes)
