"""Compressors whose payloads are parameter updates, not gradients (``update_space``: EF-signSGD).

Such a compressor encodes ``γ·g + e`` per tensor, with ``γ`` the learning rate the optimizer will apply at this
step. Two things follow for the synchronizer, both per tensor because a bucket (and a quantizer's partition) may
hold tensors of several param groups:

* before staging, every compressible tensor's ``ctx.lr`` is set to its group's *current* learning rate, read from
  the live param group (schedulers change it; the value captured at attach would go stale);
* after decoding, the tensor's aggregate ``Δ`` is divided by that same ``γ`` before it is written to ``p.grad``,
  so that the optimizer's ``γ·G`` applies ``Δ`` itself. This holds for dense sends too (they carry ``γ·g + e``).

Learning rates come from the replicated scheduler and never select a collective or a size, so reading them
locally keeps the rank-agreement rule. A learning rate of 0 cannot carry an update through ``γ·G``: such a
tensor's gradient is written as 0 (its share of the aggregate is not applied) and a warning says so once.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from ..compress.base import CompressCtx, Compressor
from ..compress.optimizers import live_param_groups
from ..errors import GravacUnsupportedError
from .buckets import Member

logger = logging.getLogger("ds_gravac")


class UpdateSpace:
    """Per-step learning rates in and out of an update-space compressor (a no-op for every other one)."""

    def __init__(self, engine: Any, compressor: Compressor, members: Sequence[Member]) -> None:
        self.enabled = compressor.update_space
        self._groups: dict[int, dict[str, Any]] = {}
        self._warned = False
        if not self.enabled:
            return
        groups = live_param_groups(engine)
        missing = [m.name for m in members if m.compressible and id(m.param) not in groups]
        if missing:
            raise GravacUnsupportedError(
                f"ds_gravac: compressor '{compressor.name}' scales every tensor by its parameter group's learning "
                f"rate, but {len(missing)} trainable parameter(s) belong to no optimizer param group (e.g. "
                f"'{missing[0]}'); pass every trainable parameter to the optimizer or freeze it")
        self._groups = {id(m.param): groups[id(m.param)] for m in members if m.compressible}

    def begin(self, ctxs: Sequence[CompressCtx]) -> None:
        """Before staging a bucket: ``ctx.lr`` ← the current learning rate of each member's group."""
        if self.enabled:
            for ctx in ctxs:
                ctx.lr = float(self._groups[id(ctx.param)]["lr"])

    def to_gradient(self, members: Sequence[Member], ctxs: Sequence[CompressCtx], flat: torch.Tensor,
                    step: int) -> None:
        """In place on a compressible bucket's decoded result: each member's update divided by its ``γ``."""
        if not self.enabled:
            return
        for m, ctx in zip(members, ctxs):
            seg = flat[m.offset:m.offset + m.numel]
            if ctx.lr != 0.0:
                seg.div_(ctx.lr)
                continue
            seg.zero_()
            if not self._warned:
                self._warned = True
                logger.warning("ds_gravac: step %d: parameter '%s' has learning rate 0, so the update sent for it "
                               "cannot be applied through the optimizer; its gradient is written as 0 (warned "
                               "once)", step, m.name)
