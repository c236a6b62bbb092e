"""Error-feedback memory: every piece of state a compressed step leaves behind, owned in one place.

Per compressible bucket there is one flat fp32 buffer per *slot* — the generic residual ``r`` (``"residual"``)
or the slots of a compressor's own memory rule (``compressor.Memory.slots``, e.g. DGC's momentum ``"u"`` and
velocity ``"v"``; ``ds_gravac.compress.memory``) — plus one *scratch* buffer. The buffers and the transaction
live here; what they mean is the rule's. A step is a transaction:

* :meth:`BucketMemory.stage` writes the step's compressor input ``x`` (``g + r``, ``g``, or the rule's
  ``compensate(g)``)
  into the scratch; the slots are only read.
* The codec encodes ``x`` and, through ``compressor.memory.commit``, turns the scratch in place into the memory the
  tensor would keep (``x − D(p)``; DGC: the velocity with the sent entries cleared). Still only scratch.
* After the ranks agreed that every gradient of the step was finite, :meth:`BucketMemory.commit_compressed`
  swaps the scratch with the ``input_slot`` and lets the rule update its other slots, or
  :meth:`BucketMemory.commit_dense` clears what a dense send transmitted (the bucket then knows its residual
  is zero: the next stage copies ``g`` without reading ``r``, and a second dense step clears nothing — two
  passes over the bucket saved on every dense step of ``auto``). The old slot buffer becomes the new
  scratch, which is where the step's decoded gradient is written (so ``p.grad`` of an fp32 contiguous parameter
  is a view of it until the next boundary backward).
* A step with a non-finite gradient on any rank commits nothing: every slot is exactly as before the step.

So the persistent cost is one buffer per slot plus one scratch per compressed element (Top-k with error
feedback: two fp32 copies of the compressed gradients), and nothing non-finite ever enters a slot.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Optional, Sequence

import torch

from ..compress.base import CompressCtx, Compressor, Payload
from ..compress.memory import CompressorMemory
from .buckets import Bucket, Member
from ..compress.local_clipping import clip_factor, grad_norm

logger = logging.getLogger("ds_gravac")
RESIDUAL = "residual"
FORMAT = 2


def flat_fp32(g: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``g`` as a flat tensor of ``dtype`` in logical (row-major) order; a view when it already is one."""
    flat = g.detach().view(-1) if g.is_contiguous() else g.detach().reshape(-1)
    return flat if flat.dtype == dtype else flat.to(dtype)


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def overrides(rule: CompressorMemory, method: str) -> bool:
    """Whether a memory rule replaces the base rule's ``method``. The base ``commit_memory`` and ``dense_sent``
    never read the gradient they are given, so the gradient is only formed for rules that replace them (an
    fp16/bf16 gradient, or one under a loss scale, costs a full fp32 copy per tensor)."""
    return getattr(type(rule), method) is not getattr(CompressorMemory, method)


class BucketMemory:
    """The slots and the scratch of one compressible bucket (see the module docstring)."""

    def __init__(self, bucket: Bucket, slots: Sequence[str], input_slot: Optional[str],
                 dtype: torch.dtype = torch.float32) -> None:
        self.members: list[Member] = list(bucket.members)
        device = self.members[0].param.device
        n = bucket.numel
        self.slots: dict[str, torch.Tensor] = {s: torch.zeros(n, dtype=dtype, device=device) for s in slots}
        self.input_slot = input_slot
        self.dtype = dtype
        self.scratch = torch.zeros(n, dtype=dtype, device=device)
        self.inv_scale = 1.0        # 1/loss scale of the step being staged: memory lives in unscaled space
        self.residual_zero = False  # True only after this class cleared the residual (commit_dense, reset):
                                    # staging then skips reading it; any other writer leaves it False
        self._views: dict[int, list[torch.Tensor]] = {}

    # ---- views ------------------------------------------------------------------------------------------
    def views(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """Per-member flat views of a bucket buffer (cached: the buffers only ever trade roles)."""
        key = buf.data_ptr()
        hit = self._views.get(key)
        if hit is None or hit[0].untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
            hit = [buf[m.offset:m.offset + m.numel] for m in self.members]
            self._views[key] = hit
        return hit

    def member_memory(self, i: int) -> dict[str, torch.Tensor]:
        return {name: self.views(buf)[i] for name, buf in self.slots.items()}

    # ---- the step's transaction ---------------------------------------------------------------------------
    def grad(self, m: Member) -> torch.Tensor:
        """``m``'s gradient, flat, in the memory's dtype and unscaled (a view when nothing needs to change)."""
        g = flat_fp32(m.param.grad, self.dtype)
        return g if self.inv_scale == 1.0 else g * self.inv_scale

    def stage(self, compressor: Compressor, ctxs: Sequence[CompressCtx], error_feedback: bool,
              squares: Optional[list[torch.Tensor]] = None, inv_scale: float = 1.0,
              clip: float = 0.0, raw_squares: Optional[list[float]] = None) -> list[torch.Tensor]:
        """Write every member's input ``x`` into the scratch; returns the per-member flat views of ``x``. With
        ``squares``, each member's ``‖x‖²`` is appended right after it was written, while ``x`` is still in cache
        (a separate pass over the bucket afterwards reads it from memory again). ``inv_scale`` (1/the fp16 loss
        scale) unscales the gradient on the way in, so residuals never depend on a scale that changes. ``clip``
        > 0 (local clipping) clips each unscaled gradient to that norm before it meets the residual; compressors
        that own their state (DGC) clip inside ``compensate`` instead. With ``raw_squares``, each member's
        unscaled ``‖g‖²`` (capped at ``clip²`` under local clipping: the gradient as clipped) is appended — the
        norm local clipping needs anyway, so the raw gain denominator costs no second pass."""
        self.inv_scale = inv_scale
        xs = self.views(self.scratch)
        for i, m in enumerate(self.members):
            g, x = m.param.grad, xs[i]
            clips_here = clip > 0.0 and not compressor.owns_state
            norm = grad_norm(g, inv_scale) if clips_here or raw_squares is not None else math.nan
            if raw_squares is not None:
                raw_squares.append(min(norm * norm, clip * clip) if clip > 0.0 else norm * norm)
            alpha = inv_scale * clip_factor(norm, clip) if clips_here else inv_scale
            if compressor.owns_state:
                ctxs[i].memory = self.member_memory(i)
                compressor.memory.compensate(self.grad(m), x, ctxs[i])
            elif error_feedback and RESIDUAL in self.slots and not self.residual_zero:
                r = self.views(self.slots[RESIDUAL])[i]
                torch.add(r.view(g.shape), g.detach(), alpha=alpha, out=x.view(g.shape))   # any layout, one pass
            else:
                x.view(g.shape).copy_(g.detach())
                if alpha != 1.0:
                    x.mul_(alpha)
            if squares is not None:
                squares.append(torch.dot(x, x))
        return xs

    def commit_compressed(self, compressor: Compressor, payloads: Optional[Sequence[Payload]],
                          ctxs: Sequence[CompressCtx]) -> None:
        """The step was agreed finite and sent compressed: the scratch (already turned into the memory left
        behind by the rule's ``commit``) becomes the ``input_slot``; the other slots follow the rule.
        ``payloads`` None: the payloads belong to bucket partitions, not members (quantizers, whose only memory
        is the input slot), so there is no per-member ``commit_memory``."""
        if self.input_slot is None:
            return
        self.slots[self.input_slot], self.scratch = self.scratch, self.slots[self.input_slot]
        self.residual_zero = False
        rule = compressor.memory
        if compressor.owns_state and payloads is not None and overrides(rule, "commit_memory"):
            for i, m in enumerate(self.members):
                ctxs[i].memory = self.member_memory(i)
                rule.commit_memory(self.grad(m), payloads[i], ctxs[i])

    def commit_dense(self, compressor: Compressor, ctxs: Sequence[CompressCtx]) -> None:
        """The step was agreed finite and this bucket's compensated input went out dense."""
        if compressor.owns_state:
            rule = compressor.memory
            reads_gradient = overrides(rule, "dense_sent")
            for i, m in enumerate(self.members):
                ctxs[i].memory = self.member_memory(i)
                if reads_gradient:
                    rule.dense_sent(self.grad(m), ctxs[i])
                else:                                   # the base rule: a dense send transmitted everything
                    rule.reset(ctxs[i])
        elif RESIDUAL in self.slots and not self.residual_zero:     # a dense step after a dense step: no pass
            self.slots[RESIDUAL].zero_()
            self.residual_zero = True

    def release_gradients(self) -> None:
        """Before staging: a ``p.grad`` that is still a view of the scratch (the user kept last step's
        gradient instead of letting the optimizer release it) gets its own storage, so staging cannot
        overwrite the raw gradient that a non-finite step would need."""
        for m in self.members:
            if m.param.grad is not None and same_storage(m.param.grad, self.scratch):
                m.param.grad = m.param.grad.clone()

    # ---- resets and inspection -------------------------------------------------------------------------
    def reset(self, names: Optional[set[str]] = None) -> None:
        """Clear every slot (or only the given members' segments)."""
        for i, m in enumerate(self.members):
            if names is None or m.name in names:
                for view in self.member_memory(i).values():
                    view.zero_()
        if names is None:
            self.residual_zero = True

    def nonzero(self) -> bool:
        return any(bool(buf.any()) for buf in self.slots.values())

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.slots.values(), self.scratch))


class ErrorFeedbackMemory:
    """All buckets' memory; checkpointed per rank, keyed by parameter name (independent of the bucket plan)."""

    def __init__(self, compressor: Compressor, error_feedback: bool) -> None:
        self.compressor = compressor
        self.error_feedback = error_feedback
        if compressor.owns_state:
            self.slot_names: tuple[str, ...] = tuple(compressor.Memory.slots)
            self.input_slot: Optional[str] = compressor.Memory.input_slot
        elif error_feedback:
            self.slot_names, self.input_slot = (RESIDUAL,), RESIDUAL
        else:
            self.slot_names, self.input_slot = (), None
        self.buckets: dict[int, BucketMemory] = {}

    def build(self, buckets: Sequence[Bucket]) -> None:
        """(Re)allocate for a bucket plan, carrying over the values of every member by name."""
        carried = self.state_dict()["slots"] if self.buckets else {}
        self.buckets = {b.index: BucketMemory(b, self.slot_names, self.input_slot) for b in buckets}
        if carried:
            self._restore(carried)

    def bucket(self, index: int) -> BucketMemory:
        return self.buckets[index]

    def reset(self, names: Optional[set[str]] = None) -> None:
        for bm in self.buckets.values():
            bm.reset(names)

    def nonzero(self) -> bool:
        return any(bm.nonzero() for bm in self.buckets.values())

    def nbytes(self) -> int:
        return sum(bm.nbytes() for bm in self.buckets.values())

    # ---- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        slots: dict[str, dict[str, torch.Tensor]] = {s: {} for s in self.slot_names}
        for bm in self.buckets.values():
            for name, buf in bm.slots.items():
                for m, view in zip(bm.members, bm.views(buf)):
                    slots[name][m.name] = view.detach().clone().cpu()
        return {"format": FORMAT, "slots": slots}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore by parameter name; anything missing or of another shape starts at zero (with a warning)."""
        self.reset()
        if state.get("format") != FORMAT:
            logger.warning("ds_gravac: error-feedback memory in the checkpoint has format %s (this version reads "
                           "%s): it starts at zero", state.get("format"), FORMAT)
            return
        self._restore(state.get("slots", {}))

    def _restore(self, slots: dict[str, dict[str, torch.Tensor]]) -> None:
        missing: list[str] = []
        for bm in self.buckets.values():
            bm.residual_zero = False
            for name, buf in bm.slots.items():
                saved = slots.get(name, {})
                for m, view in zip(bm.members, bm.views(buf)):
                    tensor = saved.get(m.name)
                    if tensor is None or tensor.numel() != view.numel():
                        missing.append(f"{name}:{m.name}")
                        view.zero_()
                    else:
                        view.copy_(tensor.reshape(-1))
        if missing:
            logger.warning("ds_gravac: %d error-feedback memory entries not in the checkpoint (or of another "
                           "size) start at zero, e.g. %s", len(missing), ", ".join(missing[:3]))


def write_grads(members: list[Member], flat: torch.Tensor, alias: bool) -> None:
    """``p.grad`` of every member from the bucket's flat result: fp32 contiguous gradients become views of it
    (no copy pass); others are copied (cast to the gradient dtype, any layout)."""
    for m in members:
        seg = flat[m.offset:m.offset + m.numel].view(m.param.shape)
        if alias and m.param.dtype == torch.float32 and m.param.is_contiguous():
            m.param.grad = seg
        else:
            m.param.grad.copy_(seg)

