"""Post-accumulate-grad hooks on the engine's parameters and the end-of-backward callback.

The hooks ignore backwards that are not at an accumulation boundary or run inside ``no_sync``. The first boundary
hook of a backward opens the step and queues the end-of-backward callback on the running autograd graph task.

Reentrant activation checkpointing (``torch.utils.checkpoint(use_reentrant=True)``, ``deepspeed.checkpointing``)
runs part of the backward as nested backward passes, each its own graph task: a callback queued from inside one
ends with that nested pass, long before the outer backward has produced every gradient. That cannot be told apart
before the first backward, so it is refused there, on every rank, before any optimizer step: the first boundary
hook of a step running below two ``torch.autograd.backward`` calls (the outer one and a nested one; CPU autograd
runs nested passes on the caller's thread), or a later hook of the step running in a graph task other than the
first hook's, raises :class:`GravacUnsupportedError`. Non-reentrant checkpointing runs in the outer graph task
and is fine.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

import torch
from torch.autograd import Variable

from ..errors import GravacUnsupportedError

REENTRANT = ("ds_gravac: a gradient hook ran inside a nested (reentrant) backward pass: reentrant activation "
             "checkpointing (torch.utils.checkpoint(..., use_reentrant=True), deepspeed.checkpointing) is not "
             "supported, because the end of the boundary backward cannot be observed from inside it; use "
             "torch.utils.checkpoint(..., use_reentrant=False)")


def _graph_task() -> int:
    return int(torch._C._current_graph_task_id())


_BACKWARD_CODES = (torch.autograd.backward.__code__, torch.autograd.grad.__code__)


def _nested_backward() -> bool:
    """Whether this hook runs inside a backward pass started from another backward pass's node."""
    depth, frame = 0, sys._getframe(1)
    while frame is not None:
        if frame.f_code in _BACKWARD_CODES:
            depth += 1
            if depth > 1:
                return True
        frame = frame.f_back
    return False


class HookManager:
    """Forwards boundary gradient readiness to the synchronizer; ignores non-boundary and ``no_sync`` backwards."""

    def __init__(self, engine: Any, params: Sequence[torch.Tensor], on_first: Callable[[], None],
                 on_ready: Callable[[int], None], on_finish: Callable[[], None]) -> None:
        self.engine = engine
        self.on_first = on_first
        self.on_ready = on_ready
        self.on_finish = on_finish
        self.active = False
        self._task = -1
        self.params = list(params)
        self._handles: list[Any] = []

    def install(self) -> None:
        """Register the gradient hooks (attach's install stage; :meth:`remove` is its mirror)."""
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(self.params)]

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            eng = self.engine
            if eng.inside_no_sync_ctxt or not eng.is_gradient_accumulation_boundary():
                return
            if not self.active:
                if _nested_backward():
                    raise GravacUnsupportedError(REENTRANT)
                self.on_first()
                Variable._execution_engine.queue_callback(self._finish)
                self._task = _graph_task()
                self.active = True
            elif _graph_task() != self._task:
                raise GravacUnsupportedError(REENTRANT)
            self.on_ready(index)
        return hook

    def _finish(self) -> None:
        try:
            self.on_finish()
        finally:
            self.active = False

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
