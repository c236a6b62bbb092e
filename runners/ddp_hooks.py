"""DDP comm hooks that issue several collectives per bucket, made safe for gloo.

PyTorch's ``powerSGD_hook`` issues three all-reduces per bucket and launches the 2nd and 3rd from completion
callbacks. With NCCL those callbacks fire as soon as the work is enqueued, so each bucket's chain is issued before
DDP calls the hook for the next bucket. With gloo they fire when the data has arrived, so bucket i's P/Q
all-reduces and bucket i+1's first all-reduce are issued in an order that depends on timing and differs between
ranks; gloo pairs collectives by issue order, and the job hangs or fails with "Received data size doesn't match
expected size" at the first compressed step (reproduced with any model that DDP splits into several buckets).

:func:`serialized` wraps such a hook so that bucket i+1's chain starts only when bucket i's has completed. The
hook itself (compression, error feedback, warm start) is untouched, the autograd thread is never blocked (the next
chain starts from the previous chain's completion callback), and the issue order is the bucket order on every
rank, which DDP already guarantees to be identical.
"""
from typing import Any, Callable

import torch
import torch.distributed as dist

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future]
# (no ``from __future__ import annotations``: DDP compares the hook's annotations with the real types)


def serialized(hook: CommHook) -> CommHook:
    """Wrap ``hook`` so its collectives are issued bucket after bucket (see the module docstring). DDP wants a
    plain function (it reads ``__qualname__`` and the annotations), so this returns a closure."""
    tail: list[torch.futures.Future] = []   # the previous bucket's result future (at most one element)

    def serialized_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        devices = [buffer.device] if buffer.device.type != "cpu" else None
        result: torch.futures.Future = torch.futures.Future(devices=devices)

        def forward_outcome(inner: torch.futures.Future) -> None:
            try:
                result.set_result(inner.value())
            except Exception as exc:  # the hook's own failure must reach DDP, not vanish in a callback
                result.set_exception(exc)

        def start(_previous: Any = None) -> None:
            try:
                inner = hook(state, bucket)
            except Exception as exc:
                result.set_exception(exc)
                return
            inner.add_done_callback(forward_outcome)

        previous = tail.pop() if tail else None
        tail.append(result)
        if previous is None or previous.done():
            start()
        else:
            previous.add_done_callback(start)   # runs inline if it completed in between
        return result

    serialized_hook.__name__ = serialized_hook.__qualname__ = f"serialized_{getattr(hook, '__name__', 'hook')}"
    return serialized_hook
