"""Encode/decode of one bucket for quantizers (the ``QUANTIZED`` kind): per bucket *partition*, not per tensor.

The bucket's flat fp32 input (every member, in plan order) is cut into ``N`` partitions of ``L = ceil(n_b/N)``
elements — flat views, the last real partition zero-padded through a scratch of ``L`` — and each partition is one
compression unit with its own header (scale, min/max, ...). The send buffer is ``N`` equal rows of ``P`` words,
row ``j`` destined for rank ``j``, the partition's owner. So sizes are equal on every rank by construction.

Worker error feedback stays per bucket element (the generic memory's scratch: ``x − D(p_j)`` is written in place);
the owner's stage (:meth:`PartitionCodec.serve`) keeps its residual in :class:`ServerResiduals` and only stages
it. Like :class:`BucketCodec`, this class never communicates and never commits persistent state.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch

from ..compress.base import CompressCtx, Compressor, Payload, TensorPlan
from ..compress.quantize import Quantizer
from .buckets import Bucket
from .codec import EncodeStats, SendLayout
from .deferred import Scalar, scalar
from .server_memory import ServerResiduals, partition_size


class PartitionCodec:
    """The codec of a compressible bucket whose compressor quantizes bucket partitions (same interface as
    :class:`ds_gravac.sync.codec.BucketCodec` where the scheduler and planner use it)."""

    def __init__(self, bucket: Bucket, compressor: Compressor, ctxs: Sequence[CompressCtx], world_size: int,
                 server: ServerResiduals) -> None:
        self.bucket, self.comp, self.ctxs, self.server = bucket, compressor, list(ctxs), server
        self.world_size = world_size
        self.numel = bucket.numel
        self.L = partition_size(self.numel, world_size)
        self.device = bucket.members[0].param.device
        first = ctxs[0]
        base = f"{bucket.members[0].name}#{self.numel}"      # stable across runs: names, not bucket indexes
        self.part_ctxs = [CompressCtx(key=f"{base}/{j}", rank=first.rank, world_size=world_size, seed=first.seed,
                                      error_feedback=first.error_feedback) for j in range(world_size)]
        self._pad = torch.zeros(self.L, dtype=torch.float32, device=self.device)
        self._layouts: dict[float, SendLayout] = {}
        self._used: set[float] = set()

    # ---- layouts ------------------------------------------------------------------------------------------
    def _level(self, levels: Sequence[float]) -> float:
        """One level per bucket, since a partition may span several members: the least compression any member
        asks for (under Accordion, one critical layer keeps its whole bucket at low compression). The levels
        come from the step plan, so every rank takes the same one."""
        return float(min(levels))

    def plan(self, levels: Sequence[float]) -> TensorPlan:
        return self.comp.plan(self.L, self._level(levels))

    def plans(self, levels: Sequence[float]) -> list[TensorPlan]:
        """One plan per partition (all equal): what the planner sums to price the bucket's payload."""
        return [self.plan(levels)] * self.world_size

    def layout(self, levels: tuple[float, ...]) -> SendLayout:
        level = self._level(levels)
        self._used.add(level)
        lay = self._layouts.get(level)
        if lay is None:
            plan = self.plan(levels)
            words = plan.words
            send = torch.zeros(self.world_size * words, dtype=torch.int32, device=self.device)
            offsets = [j * words for j in range(self.world_size)]
            lay = self._layouts[level] = SendLayout(
                [plan] * self.world_size, offsets, len(send), send,
                [Payload(plan, send[o:o + words]) for o in offsets], values_sent=self.numel,
                payload_words=len(send))
        return lay

    def end_step(self) -> bool:
        dropped = len(self._layouts)
        self._layouts = {k: v for k, v in self._layouts.items() if k in self._used}
        self._used = set()
        return dropped > len(self._layouts) and self.device.type == "cpu"

    def nbytes(self) -> int:
        total = self._pad.numel() * 4
        for lay in self._layouts.values():
            total += lay.send.numel() * 4 + sum(b.numel() * b.element_size() for b in lay.buffers.values())
        return total

    # ---- partitions -----------------------------------------------------------------------------------------
    def _flat(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The bucket's flat input: the members' staged views are consecutive slices of one scratch buffer."""
        x0 = xs[0]
        flat = x0.as_strided((self.numel,), (1,), x0.storage_offset() - self.bucket.members[0].offset)
        assert xs[-1].data_ptr() == flat[self.bucket.members[-1].offset:].data_ptr()
        return flat

    def _real(self, j: int) -> int:
        return max(0, min(self.L, self.numel - j * self.L))

    def _part(self, flat: torch.Tensor, j: int) -> torch.Tensor:
        """Partition j of ``flat``: a view, or the zero-padded scratch when it runs past the bucket's end."""
        c, lo = self._real(j), j * self.L
        if c == self.L:
            return flat[lo:lo + c]
        self._pad[c:].zero_()
        self._pad[:c].copy_(flat[lo:lo + c])
        return self._pad

    def _put(self, out: torch.Tensor, j: int, part: torch.Tensor) -> None:
        """Write back the real elements of a padded partition (a view was written in place already)."""
        c, lo = self._real(j), j * self.L
        if part is self._pad and c:
            out[lo:lo + c].copy_(part[:c])

    def _sync_step(self) -> None:
        for ctx in self.part_ctxs:
            ctx.step = self.ctxs[0].step

    # ---- encode -------------------------------------------------------------------------------------------
    def encode(self, xs: Sequence[torch.Tensor], send: Optional[tuple[float, ...]], probes: Sequence[float],
               live: Sequence[bool], extra_sends: Sequence[tuple[float, ...]] = ()) -> tuple[
                   Optional[SendLayout], EncodeStats]:
        """Encode every partition at the send level, at each live probe level and at each ``extra_sends`` level
        (strict decisions: the branch is chosen after the statistics exchange). Every level is encoded directly
        from x — quantizers have no multi-level derivation — straight into that level's send layout, so the
        level finally sent is never encoded twice. Pure."""
        st = EncodeStats(nums=[0.0] * len(probes))
        self._sync_step()
        flat = self._flat(xs)
        lay = self.layout(send) if send is not None else None
        measured = [float(p) for p, ok in zip(probes, live) if ok]
        sent = [self._level(send)] if send is not None else []
        direct = sent + [self._level(t) for t in extra_sends]      # encoded for sending, not only to measure
        levels = list(dict.fromkeys(sent + measured + direct))
        for lvl in levels:
            t0 = time.perf_counter()
            target = lay if lay is not None and lvl == sent[0] else self.layout((lvl,))
            for j, (p, ctx) in enumerate(zip(target.payloads, self.part_ctxs)):
                self.comp.compress(self._part(flat, j), p.plan, p, ctx, update_state=False)
            if lvl in measured:
                st.add_sent_norm(lvl, self._sent_norm(target), probes, live)
            dt = time.perf_counter() - t0
            st.compress_s += dt
            if lvl not in direct:
                st.probe_s += dt
        return lay, st

    def _sent_norm(self, lay: SendLayout) -> Scalar:
        """``‖D(p)‖²`` over the bucket's real elements (the gain numerator): the padded tail of the last real
        partition decodes to something too (a sign scale, a min/max level), which is never applied."""
        total: Scalar = 0.0        # float64 device additions in partition order (read once: sync/deferred.py)
        for j, (p, ctx) in enumerate(zip(lay.payloads, self.part_ctxs)):
            c = self._real(j)
            if c == self.L:
                total = total + scalar(self.comp.sent_sq_norm(p, ctx))
            elif c:     # the scratch is free here: every partition of this level is encoded already
                self.comp.decompress(p, self._pad, accumulate=False, scale=1.0, ctx=ctx)
                total = total + self._pad[:c].double().square().sum()
        return total

    def leave_memory(self, xs: Sequence[torch.Tensor], lay: SendLayout) -> None:
        """Worker error feedback per partition: the staged input becomes ``x − D(p_j)`` in place (scratch only)."""
        flat = self._flat(xs)
        for j, (p, ctx) in enumerate(zip(lay.payloads, self.part_ctxs)):
            part = self._part(flat, j)
            ctx.residual = part
            self.comp.memory.commit(part, p, ctx)
            ctx.residual = None
            self._put(flat, j, part)

    # ---- the owner's stage and decoding -------------------------------------------------------------------
    def serve(self, lay: SendLayout, received: torch.Tensor, q: torch.Tensor) -> None:
        """Owner: merge every rank's payload of my partition (+ server residual), re-encode into ``q``, and stage
        the server residual that sending ``q`` leaves (committed only after the step's agreement)."""
        plan, me = lay.plans[0], self.part_ctxs[0].rank
        ctx = self.part_ctxs[me]
        rows = [Payload(plan, received[o:o + plan.words]) for o in lay.word_offsets]
        y = self.server.staged(self.bucket.index)
        self.comp.merge_decode(rows, y, ctx, server_residual=self.server.residual(self.bucket.index))
        qp = Payload(plan, q)
        self.comp.server_encode(y, plan, qp, ctx)
        self.comp.server_commit(y, qp, ctx)

    def _decode_part(self, payloads: Sequence[Payload], out: torch.Tensor, j: int, scale: float) -> None:
        """``out[partition j] = 0 + scale·Σ_w D(p_w)`` in rank order (the padded tail is dropped): what zeroing
        ``out`` and accumulating the decodes gives, in one sweep over the partition (``Quantizer.decode_sum``)."""
        lo, c = j * self.L, self._real(j)
        if not c:
            return
        dst = out[lo:lo + c] if c == self.L else self._pad
        if isinstance(self.comp, Quantizer):
            self.comp.decode_sum(payloads, dst, scale, "zero")
        else:                                      # a quantizer outside the Quantizer base: one decode per row
            dst.zero_()
            for p in payloads:
                self.comp.decompress(p, dst, accumulate=True, scale=scale, ctx=self.part_ctxs[j])
        if c < self.L:
            out[lo:lo + c].copy_(self._pad[:c])

    def decode_owners(self, lay: SendLayout, rows: torch.Tensor, out: torch.Tensor, scale: float) -> None:
        """Parameter server: row j of ``rows`` is owner j's re-encoded partition; ``out = scale · D(row j)``."""
        out[self.numel:].zero_()
        plan = lay.plans[0]
        for j in range(self.world_size):
            self._decode_part([Payload(plan, rows[j])], out, j, scale)

    def decode_rows(self, lay: SendLayout, rows: torch.Tensor, out: torch.Tensor, scale: float, bulk: bool) -> None:
        """All-gather pattern: row w holds all N partitions of rank w; ``out = scale · Σ_w D(row_w)``."""
        out[self.numel:].zero_()
        plan = lay.plans[0]
        for j, off in enumerate(lay.word_offsets):
            self._decode_part([Payload(plan, rows[w, off:off + plan.words]) for w in range(rows.shape[0])], out, j,
                              scale)

    def commit_aggregate(self, lay: Optional[SendLayout], out: torch.Tensor) -> None:
        """Quantizers keep no state that depends on the aggregate."""

    def shared_selection_digest(self, levels: tuple[float, ...]) -> int:
        return 0
