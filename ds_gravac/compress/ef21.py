"""``ef21``: Top-k that corrects a gradient *estimate* instead of delivering a delayed residual (EF21).

Why: classic error feedback (``x = g + r``, send Top-k of x, keep the rest in r) delivers every coordinate in
full, but late, and heavy-ball momentum then amplifies those late bursts: on short budgets the loss first rises
before compressed training catches up. EF21 (Richtárik, Sokolov and Fatkhullin, 2021) keeps per rank an estimate
``h`` of its gradient and sends only the largest entries of the *change* ``g − h``; every rank keeps the same
running average ``H`` of the estimates, and ``H`` — a smooth, always-complete gradient — is what the optimizer
applies. Nothing is held back to arrive later, so momentum sees no bursts.

Per tensor and step (``D`` = the decode of a payload, ``C`` = Top-k):

* compensate: ``x = g − h``;  payload ``p = C(x)`` (Top-k's selection and wire format, all-gathered);
* commit (scratch): ``x ← h + D(p)``, which the memory adopts as the new ``h`` once the step is agreed finite;
* commit_aggregate: ``H ← H + mean_i D(p_i)`` (the decoded aggregate) and the aggregate is replaced by ``H``;
* a dense send transmits ``g − h`` exactly: ``h ← g`` and ``H ← H + mean(g − h) = mean(g)``, the dense average.

``H`` equals the mean of the ranks' ``h`` after every step (both start at zero and change by the same decoded
values), so it is replicated state although each rank keeps its own copy. Memory: ``h``, ``H`` and the staging
scratch, three gradient-sized fp32 buffers (Top-k with a residual: two). The optimizer's momentum and weight
decay stay with the optimizer and act on ``H``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .base import CompressCtx, Payload
from .memory import CompressorMemory
from .topk import TopK

Tensor = torch.Tensor


class EF21Memory(CompressorMemory):
    """EF21's memory: this rank's gradient estimate ``h`` (the input slot) and the shared estimate ``H`` the
    optimizer applies. The input is the change ``g − h``; after a send ``h ← h + D(p)`` and ``H ← H + G``."""

    slots = ("h", "H")
    input_slot = "h"

    def compensate(self, g: Tensor, out: Tensor, ctx: CompressCtx) -> None:
        torch.sub(g, ctx.memory["h"], out=out)

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """The scratch becomes the new estimate ``h + D(p)`` (adopted as ``h`` after the agreement)."""
        x.copy_(ctx.memory["h"])
        self.comp.decompress(p, x, accumulate=True, scale=1.0, ctx=ctx)

    def dense_sent(self, g: Tensor, ctx: CompressCtx) -> None:
        """``g − h`` went out whole: the estimate is now the gradient itself."""
        ctx.memory["h"].copy_(g)

    def commit_aggregate(self, x: Tensor, g: Tensor, payloads: Sequence[Payload], ctx: CompressCtx) -> None:
        """Fold the decoded mean change into the shared estimate and hand the optimizer the estimate."""
        est = ctx.memory["H"]
        est.add_(g)
        g.copy_(est)


class EF21(TopK):
    """Top-k of the change of a per-rank gradient estimate; the optimizer applies the shared estimate."""

    name = "ef21"
    owns_state = True
    Memory = EF21Memory


__all__ = ["EF21"]
