"""CUDA streams of the step: compressible buckets are staged, encoded and their collectives issued on one side
stream per device, so that this work overlaps the rest of backward on the main stream. On any other device every
function here is a no-op (CPU work is ordered by the host).

Ordering (docs/design.md §10):

- each launch first makes the side stream wait for everything queued on the main stream so far (the gradients
  backward produced, and the last use of any memory the allocator may hand out again), then runs on the side
  stream; the collectives it issues are therefore ordered after the encode that filled their buffers;
- the gradients read on the side stream are marked with ``record_stream``, so memory DeepSpeed or the user frees
  on the main stream is not reused before the side stream is done with it;
- at the end of backward the main stream waits for the side stream (:meth:`SideStreams.join`) before anything is
  decoded, committed or written to ``p.grad``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch


class SideStreams:
    """One side stream per CUDA device, created on first use."""

    def __init__(self) -> None:
        self._side: dict[torch.device, torch.cuda.Stream] = {}

    def _stream(self, device: torch.device) -> Optional["torch.cuda.Stream"]:
        if device.type != "cuda":
            return None
        s = self._side.get(device)
        if s is None:
            s = self._side[device] = torch.cuda.Stream(device=device)
        return s

    @contextlib.contextmanager
    def launch(self, device: torch.device, inputs: Sequence[Optional[torch.Tensor]] = ()) -> Iterator[None]:
        """Run the block (stage, encode, issue) on the side stream of ``device``, after the main stream's work;
        ``inputs`` (gradients made on the main stream) are recorded as used by the side stream."""
        side = self._stream(device)
        if side is None:
            yield
            return
        side.wait_stream(torch.cuda.current_stream(device))
        for t in inputs:
            if t is not None and t.is_cuda:
                t.record_stream(side)
        with torch.cuda.stream(side):
            yield

    def join(self) -> None:
        """The main stream waits for everything issued on the side streams (end of backward)."""
        for device, side in self._side.items():
            torch.cuda.current_stream(device).wait_stream(side)


def to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host tensors of one dtype on ``device`` in one transfer that does not wait for the device (pinned memory,
    non-blocking: the caching host allocator keeps the buffer until the copy ran); on any other device the tensors
    themselves. For the per-step index tensors of the error signals, drawn on the CPU."""
    if device.type != "cuda" or not tensors:
        return list(tensors)
    flat = torch.cat([t.reshape(-1) for t in tensors]).pin_memory()
    moved = flat.to(device, non_blocking=True)
    out, at = [], 0
    for t in tensors:
        out.append(moved[at:at + t.numel()].view(t.shape))
        at += t.numel()
    return out


__all__ = ["SideStreams", "to_device"]
