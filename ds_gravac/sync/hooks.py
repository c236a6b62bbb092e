"""Post-accumulate-grad hooks on the engine's parameters and the end-of-backward callback (deepspeed.md §2)."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.autograd import Variable


class HookManager:
    """Forwards boundary gradient readiness to the synchronizer; ignores non-boundary and ``no_sync`` backwards."""

    def __init__(self, engine: Any, params: Sequence[torch.Tensor], on_first: Callable[[], None],
                 on_ready: Callable[[int], None], on_finish: Callable[[], None]) -> None:
        self.engine = engine
        self.on_first = on_first
        self.on_ready = on_ready
        self.on_finish = on_finish
        self.active = False
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, p in enumerate(params)]

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            eng = self.engine
            if eng.inside_no_sync_ctxt or not eng.is_gradient_accumulation_boundary():
                return
            if not self.active:
                self.active = True
                self.on_first()
                Variable._execution_engine.queue_callback(self._finish)
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
