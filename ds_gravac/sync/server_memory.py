"""Server residuals of the parameter-server exchange: the error a rank's *owner* stage leaves behind.

Under the CaSync-PS pattern every rank owns one partition of ``L = ceil(n_b/N)`` elements of each compressible
bucket; re-encoding the merged partition leaves ``s_j = y_j − D(q_j)``, which joins the next step's merge. That is
persistent per-rank state with the same transaction rules as the worker residual (``ds_gravac.sync.memory``):

* the exchange writes the candidate residual into the bucket's step-local buffer (:meth:`ServerResiduals.staged`)
  and never touches the committed one;
* after the ranks agreed that the step was finite, the scheduler adopts it (:meth:`ServerResiduals.commit`);
* a non-finite step (or a bucket sent dense) adopts nothing: ``s_j`` is exactly as before. A dense send leaves
  ``s_j`` in place on purpose — that mass was never transmitted, so dropping it would break conservation.

The residuals depend on the bucket plan and the world size (which partition a rank owns), so a checkpoint stores
them with the plan's layout signature and a restore under another plan or world size starts them at zero.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import torch

from .buckets import Bucket

logger = logging.getLogger("ds_gravac")
FORMAT = 1


def partition_size(numel: int, world_size: int) -> int:
    """``L = ceil(n_b/N)``: every rank owns one partition of this many elements (the last one zero-padded)."""
    return -(-numel // world_size)


class ServerResiduals:
    """The committed ``s_j`` of the partitions this rank owns (one per compressible bucket) and their step-local
    candidates; ``enabled`` false keeps nothing (server error feedback off) but still lends merge scratch."""

    def __init__(self, enabled: bool, world_size: int) -> None:
        self.enabled, self.world_size = enabled, world_size
        self.slots: dict[int, torch.Tensor] = {}
        self._scratch: dict[int, torch.Tensor] = {}
        self._pending: set[int] = set()
        self.signature: Optional[int] = None

    def build(self, buckets: Sequence[Bucket], signature: int) -> None:
        """(Re)allocate for a bucket plan; residuals of another plan do not carry over (other partitions)."""
        self.signature = signature
        self._pending.clear()
        self._scratch = {}
        self.slots = {}
        for b in buckets:
            size = partition_size(b.numel, self.world_size)
            device = b.members[0].param.device
            self._scratch[b.index] = torch.zeros(size, dtype=torch.float32, device=device)
            if self.enabled:
                self.slots[b.index] = torch.zeros(size, dtype=torch.float32, device=device)

    # ---- the step's transaction ---------------------------------------------------------------------------
    def residual(self, b: int) -> Optional[torch.Tensor]:
        """The committed ``s_j`` of bucket b (read only), or None without server error feedback."""
        return self.slots.get(b)

    def staged(self, b: int) -> torch.Tensor:
        """Bucket b's step-local buffer: the merge scratch, turned into the candidate ``s_j`` by the exchange."""
        if self.enabled:
            self._pending.add(b)
        return self._scratch[b]

    def commit(self, b: int) -> None:
        """After the agreement: adopt bucket b's candidate (no-op unless this step staged one)."""
        if b in self._pending:
            self._pending.discard(b)
            self.slots[b], self._scratch[b] = self._scratch[b], self.slots[b]

    def discard(self) -> None:
        """Forget this step's candidates (non-finite step, or a new step begins)."""
        self._pending.clear()

    def reset(self) -> None:
        self._pending.clear()
        for buf in self.slots.values():
            buf.zero_()

    def nonzero(self) -> bool:
        return any(bool(buf.any()) for buf in self.slots.values())

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.slots.values(), *self._scratch.values()))

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "world_size": self.world_size, "signature": self.signature,
                "residuals": {int(b): t.detach().clone().cpu() for b, t in self.slots.items()}}

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        """Restore exactly when the plan and world size match; otherwise start at zero (with a warning)."""
        self.reset()
        saved = (state or {}).get("residuals") or {}
        if not self.enabled or not saved:
            return
        same = (state.get("format") == FORMAT and state.get("world_size") == self.world_size
            and state.get("signature") == self.signature)
        if (not same or set(saved) != set(self.slots)
                or any(saved[b].numel() != self.slots[b].numel() for b in self.slots)):
            logger.warning("ds_gravac: the checkpoint's server residuals belong to another bucket plan or world "
                           "size: they start at zero")
            return
        for b, buf in self.slots.items():
            buf.copy_(saved[b].reshape(-1))
