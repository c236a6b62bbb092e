"""A compressor's per-tensor memory rule (the Memory of GRACE's compressor / memory / communicator split).

The synchronizer (``ds_gravac.sync.memory``) owns the buffers and the transaction: it stages the step's input
into a scratch, and only after the ranks agreed the step finite does it adopt that scratch as the input slot and
let the rule update the other slots. The rule says what the buffers mean. It never allocates or keeps tensors of
its own: every method works on views it is given (``ctx.memory``: slot name → this tensor's flat fp32 view;
``ctx.residual``: the external residual, which may alias ``x``).

:class:`CompressorMemory` is plain error feedback, ``x = g + r`` (formed by the synchronizer) and ``r ← x − D(p)``;
it declares no slots of its own, so the synchronizer keeps its generic ``"residual"`` slot when the section's
``error_feedback`` is on. A compressor whose algorithm *is* a memory (DGC's momentum and velocity, EF21's
estimates, the low-rank error, TBQ's residual) names a subclass that declares ``slots`` and ``input_slot`` and
implements ``compensate``/``commit``/… (its compressor sets ``owns_state = True``).

The life of one tensor in one step, with ``m = compressor.memory``:

1. ``m.compensate(g, out, ctx)`` (own slots only): write the compressor's input ``x`` into ``out``, reading
   ``ctx.memory`` but never changing it.
2. The compressor encodes ``x`` (pure).
3. ``m.commit(x, p, ctx)``: turn ``x`` *in place* into the memory this tensor keeps after sending ``p``; ``x`` is
   the step's scratch, so nothing persistent changes here.
4. After the agreement the synchronizer adopts that scratch as ``input_slot`` and calls
   ``m.commit_memory(g, p, ctx)`` for the other slots; a dense send calls ``m.dense_sent(g, ctx)`` instead. Once
   the bucket's aggregate ``G`` is decoded, ``m.commit_aggregate(x, G, payloads, ctx)`` updates what depends on it
   (PowerSGD: ``E = X − G`` and the warm start; EF21: the shared estimate). A step whose gradients were not finite
   on some rank does none of this.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, ClassVar, Optional, Protocol, Sequence

import torch

from ..config_aliases import GravacDeprecationWarning
from .payload import CompressCtx, Payload

Tensor = torch.Tensor


class Decoder(Protocol):
    """What the base rule needs of its compressor (the rules depend on this, not on the whole contract, which
    names :class:`CompressorMemory` as every compressor's default); a subclass narrows ``comp`` to its own."""

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None: ...


class SwitchedDecoder(Decoder, Protocol):
    @property
    def worker_error_feedback(self) -> bool: ...


class GainDecoder(Decoder, Protocol):
    def input_gain(self, ctx: CompressCtx) -> float: ...


class CompressorMemory:
    """Plain error feedback: ``r ← x − D(p)`` into the external residual (see the module docstring)."""

    slots: ClassVar[tuple[str, ...]] = ()          # own flat fp32 buffers per tensor (none: the generic residual)
    input_slot: ClassVar[Optional[str]] = None     # the slot that becomes the committed input after a send

    def __init__(self, compressor: Decoder) -> None:
        self.comp = compressor

    def compensate(self, g: Tensor, out: Tensor, ctx: CompressCtx) -> None:
        """Own slots only: the compressor's input from the flat fp32 gradient ``g`` and ``ctx.memory``."""
        out.copy_(g)

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """Leave in ``ctx.residual`` (which may alias ``x``) the memory after sending ``p``: ``x − D(p)``."""
        if ctx.residual is None or not ctx.error_feedback:
            return
        if ctx.residual.data_ptr() != x.data_ptr():
            ctx.residual.copy_(x)
        self.comp.decompress(p, ctx.residual, accumulate=True, scale=-1.0, ctx=ctx)

    def commit_memory(self, g: Tensor, p: Payload, ctx: CompressCtx) -> None:
        """Own slots only, finite step: update the slots other than ``input_slot`` for the sent payload ``p``;
        ``g`` is the gradient :meth:`compensate` received."""

    def commit_aggregate(self, x: Tensor, g: Tensor, payloads: Sequence[Payload], ctx: CompressCtx) -> None:
        """Own slots only, finite step: after the tensor's aggregate ``g`` was decoded. ``payloads``: the reduced
        payloads of every round, empty when the tensor went dense (``g`` is then the exact average); ``x``: the
        committed ``input_slot`` view after a compressed send."""

    def dense_sent(self, g: Tensor, ctx: CompressCtx) -> None:
        """Own slots only: the input went out dense (after the agreement); it transmitted everything it held."""
        self.reset(ctx)

    def reset(self, ctx: CompressCtx) -> None:
        """Clear this tensor's own memory (dense step, error-feedback reset, world-size change)."""
        for view in ctx.memory.values():
            view.zero_()


class SwitchedErrorFeedback(CompressorMemory):
    """Error feedback the compressor may switch off (``worker_error_feedback``: casts, quantizers). With it off, a
    supplied residual is zeroed instead: that is the memory an EF-off compressor keeps, and a memory that adopts
    the scratch must not keep the stale input."""

    comp: SwitchedDecoder

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        r = ctx.residual
        if r is None:
            return
        if not (ctx.error_feedback and self.comp.worker_error_feedback):
            r.zero_()
            return
        if r.data_ptr() != x.data_ptr():
            r.copy_(x.reshape(-1))
        self.comp.decompress(p, r, accumulate=True, scale=-1.0, ctx=ctx)


class ResidualMemory(CompressorMemory):
    """One slot that is both the memory and the input (TBQ's residual, EF-signSGD's update-space error):
    ``x = gain·g + m`` (``gain``: the compressor's ``input_gain``) and ``m ← x − D(p)``."""

    slots: ClassVar[tuple[str, ...]] = ("m",)
    input_slot: ClassVar[Optional[str]] = "m"
    comp: GainDecoder

    def compensate(self, g: Tensor, out: Tensor, ctx: CompressCtx) -> None:
        mem = ctx.memory[self.input_slot]
        gain = self.comp.input_gain(ctx)
        if gain == 1.0:
            torch.add(mem, g.reshape(-1), out=out)
        else:   # rounded product, then sum: ``m + γ·g`` as written, whatever fused kernels a backend has
            torch.mul(g.reshape(-1), gain, out=out)
            out.add_(mem)

    def commit(self, x: Tensor, p: Payload, ctx: CompressCtx) -> None:
        self.comp.decompress(p, x.reshape(-1), accumulate=True, scale=-1.0, ctx=ctx)


# ---- plug-ins written for the contract up to 0.4 ------------------------------------------------------------
LEGACY_HOOKS = ("compensate", "commit", "commit_memory", "commit_aggregate", "dense_sent", "reset")


def _forward(name: str) -> Callable[..., None]:
    def hook(self: CompressorMemory, *args: Any) -> None:
        getattr(self.comp, name)(*args)
    hook.__name__ = name
    return hook


def legacy_memory(cls: type) -> Optional[type[CompressorMemory]]:
    """Up to 0.4 a compressor carried its memory hooks itself (``memory_slots``, ``input_slot``, ``compensate``,
    ``commit``, …). For a plug-in that still does, a rule that forwards to them (with a deprecation warning), so
    it keeps working unchanged; ``None`` for a class that defines none of them."""
    hooks = [n for n in LEGACY_HOOKS if n in vars(cls)]
    fields = {n: vars(cls)[n] for n in ("memory_slots", "input_slot") if n in vars(cls)}
    if not hooks and not fields:
        return None
    base: type[CompressorMemory] = cls.Memory     # type: ignore[attr-defined]
    namespace: dict[str, Any] = {n: _forward(n) for n in hooks}
    namespace["slots"] = tuple(fields.get("memory_slots", base.slots))
    namespace["input_slot"] = fields.get("input_slot", base.input_slot)
    warnings.warn(f"ds_gravac: compressor {cls.__name__} defines {', '.join([*fields, *hooks])} on the compressor; "
                  f"they now belong to its memory rule (a ds_gravac.compress.memory.CompressorMemory subclass "
                  f"named by the class attribute Memory). They are forwarded for now", GravacDeprecationWarning,
                  stacklevel=3)
    return type(f"{cls.__name__}Memory", (base,), namespace)


__all__ = ["CompressorMemory", "SwitchedErrorFeedback", "ResidualMemory", "legacy_memory"]
