"""One compressible bucket's encode and decode: payload layouts per level tuple, multi-level probes, decoding.

The codec never communicates (exchange patterns do) and never keeps error-feedback state (the memory does); it
only owns payload buffers. Those are cached per level tuple and per probe size and dropped at the end of a step
that did not use them, so a level the controller stopped sending or probing frees its buffers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch

from ..compress.base import CompressCtx, Compressor, Kind, Multilevel, Payload, TensorPlan, stable_hash
from .buckets import Bucket
from .deferred import Scalar, scalar


@dataclass
class SendLayout:
    """Payload layout of one bucket at one tuple of per-member levels."""

    plans: list[TensorPlan]
    word_offsets: list[int]
    words: int
    send: torch.Tensor
    payloads: list[Payload]
    values_sent: int = 0
    payload_words: int = 0                     # all rounds (``words`` is the first round's send buffer)
    round2: Optional[torch.Tensor] = None      # two-round patterns: the second round's buffer and views
    round2_payloads: list[Payload] = field(default_factory=list)
    bulk_idx_pos: Optional[torch.Tensor] = None
    bulk_val_pos: Optional[torch.Tensor] = None
    bulk_offsets: Optional[torch.Tensor] = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)   # receive buffers of the exchange pattern
    first: int = 0                             # a chunk's layout: its first member and that member's offset
    elem0: int = 0
    chunks: dict[tuple[int, int], "SendLayout"] = field(default_factory=dict)   # chunk layouts (views of this)


@dataclass
class EncodeStats:
    """What encoding one bucket adds to the step's statistics."""

    nums: list[Scalar]
    compress_s: float = 0.0
    probe_s: float = 0.0

    def add_sent_norm(self, level: float, norm: Scalar, probes: Sequence[Any], live: Sequence[bool]) -> None:
        """Add ``‖D(p)‖²`` of a payload at ``level`` to every live statistics slot that probes that level."""
        for slot, (p, ok) in enumerate(zip(probes, live)):
            if ok and float(p) == level:
                self.nums[slot] += norm


class BucketCodec:
    """Encode/decode of one bucket whose members are all compressible."""

    def __init__(self, bucket: Bucket, compressor: Compressor, ctxs: Sequence[CompressCtx]) -> None:
        self.bucket = bucket
        self.comp = compressor
        self.ctxs = list(ctxs)
        self.device = bucket.members[0].param.device
        self.word_dtype = torch.float32 if compressor.kind == Kind.SUMMABLE else torch.int32
        self._layouts: dict[tuple[tuple[float, ...], int], SendLayout] = {}
        self._scratch: dict[tuple[int, str], torch.Tensor] = {}
        self._used_layouts: set[tuple[tuple[float, ...], int]] = set()
        self._used_scratch: set[tuple[int, str]] = set()

    # ---- buffers ----------------------------------------------------------------------------------------
    def seg(self, buf: torch.Tensor, i: int) -> torch.Tensor:
        m = self.bucket.members[i]
        return buf[m.offset:m.offset + m.numel]

    def plans(self, levels: Sequence[float]) -> list[TensorPlan]:
        return [self.comp.tensor_plan(m.param.shape, lvl) for m, lvl in zip(self.bucket.members, levels)]

    def layout(self, levels: tuple[float, ...]) -> SendLayout:
        key = (levels, self.comp.phase)           # the phase (ACP's P/Q) is fixed for the whole step
        self._used_layouts.add(key)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = self._build_layout(levels)
        return lay

    def _build_layout(self, levels: tuple[float, ...]) -> SendLayout:
        plans = self.plans(levels)
        offsets, total = [], 0
        for p in plans:
            offsets.append(total)
            total += p.words
        send = torch.zeros(total, dtype=self.word_dtype, device=self.device)
        payloads = [Payload(p, send[o:o + p.words]) for p, o in zip(plans, offsets)]
        lay = SendLayout(plans, offsets, total, send, payloads, values_sent=sum(p.values_sent for p in plans),
                         payload_words=sum(self.comp.sent_payload_words(p) for p in plans))
        second = [p.get("round2") for p in plans]
        if any(q is not None for q in second):
            second = [q if q is not None else _EMPTY for q in second]
            lay.round2 = torch.zeros(sum(q.words for q in second), dtype=self.word_dtype, device=self.device)
            off = 0
            for q in second:
                lay.round2_payloads.append(Payload(q, lay.round2[off:off + q.words]))
                off += q.words
        self._bulk_positions(lay)
        return lay

    def _bulk_positions(self, lay: SendLayout) -> None:
        """Sparse fp32 payloads: where every entry's index and value sit in a row, and its member's offset in the
        decoded output (relative to the layout's first element), for one ``index_add_`` per row set."""
        if self.comp.kind == Kind.SUMMABLE or not all(_is_sparse_fp32(p) for p in lay.plans):
            return
        idx_pos, val_pos, offs = [], [], []
        for i, (p, o) in enumerate(zip(lay.plans, lay.word_offsets)):
            io, vo = o + p.offset_of("idx"), o + p.offset_of("val")
            idx_pos.append(torch.arange(io, io + p.k, dtype=torch.int32))     # int32: buckets are < 2^31
            val_pos.append(torch.arange(vo, vo + p.k, dtype=torch.int32))
            offs.append(torch.full((p.k,), self.bucket.members[lay.first + i].offset - lay.elem0, dtype=torch.int32))
        lay.bulk_idx_pos = torch.cat(idx_pos).to(self.device)
        lay.bulk_val_pos = torch.cat(val_pos).to(self.device)
        lay.bulk_offsets = torch.cat(offs).to(self.device)

    def chunk(self, lay: SendLayout, span: tuple[int, int]) -> SendLayout:
        """The layout of members ``span[0]:span[1]`` of ``lay``: views of its send buffer and payloads (so encoding
        into ``lay`` fills every chunk), its own receive buffers; decodes into the chunk's slice of the output."""
        hit = lay.chunks.get(span)
        if hit is None:
            a, b = span
            w0 = lay.word_offsets[a]
            words = (lay.word_offsets[b - 1] + lay.plans[b - 1].words) - w0
            plans = lay.plans[a:b]
            hit = lay.chunks[span] = SendLayout(
                plans, [o - w0 for o in lay.word_offsets[a:b]], words, lay.send[w0:w0 + words], lay.payloads[a:b],
                values_sent=sum(p.values_sent for p in plans),
                payload_words=sum(self.comp.sent_payload_words(p) for p in plans),
                first=a, elem0=self.bucket.members[a].offset)
            self._bulk_positions(hit)
        return hit

    def _probe_payload(self, i: int, role: str, plan: TensorPlan) -> Payload:
        """A payload for a level that is measured but not sent: one buffer per member and role, grown on demand
        (``base``: the multi-level first stage; ``other``: every further level, one after the other)."""
        key = (i, role)
        self._used_scratch.add(key)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < plan.words:
            buf = self._scratch[key] = torch.zeros(plan.words, dtype=self.word_dtype, device=self.device)
        return Payload(plan, buf[:plan.words])

    def end_step(self) -> bool:
        """Drop the buffers of levels this step neither sent nor measured (a level's layouts for the other phases
        stay: ACP-SGD alternates them every step); True when host buffers were dropped."""
        dropped = len(self._layouts) + len(self._scratch)
        levels = {k[0] for k in self._used_layouts}     # a used level keeps its layouts of every phase (ACP's P/Q)
        self._layouts = {k: v for k, v in self._layouts.items() if k[0] in levels}
        self._scratch = {k: v for k, v in self._scratch.items() if k in self._used_scratch}
        dropped -= len(self._layouts) + len(self._scratch)
        self._used_layouts, self._used_scratch = set(), set()
        return dropped > 0 and self.device.type == "cpu"

    def nbytes(self) -> int:
        total = sum(b.numel() * b.element_size() for b in self._scratch.values())
        for lay in self._layouts.values():
            total += lay.send.numel() * lay.send.element_size()
            if lay.round2 is not None:
                total += lay.round2.numel() * lay.round2.element_size()
            total += sum(b.numel() * b.element_size() for b in lay.buffers.values())
            total += sum(b.numel() * b.element_size() for c in lay.chunks.values() for b in c.buffers.values())
        return total

    # ---- encode -----------------------------------------------------------------------------------------
    def encode(self, xs: Sequence[torch.Tensor], send: Optional[tuple[float, ...]], probes: Sequence[float],
               live: Sequence[bool], extra_sends: Sequence[tuple[float, ...]] = (),
               span: Optional[tuple[int, int]] = None, stats: Optional[EncodeStats] = None) -> tuple[
                   Optional[SendLayout], EncodeStats]:
        """Encode every member (or those of ``span``, a pipeline chunk) at its send level and at each live probe
        level (gains only); ``stats`` continues an earlier chunk's statistics, in member order.

        Multi-level: the first probe level (GraVAC's θ_min) is compressed directly; every level above it is
        derived from that payload (``compress_from``), every level below it is compressed directly — never chained
        from another derived level. A level that is also sent is encoded straight into the send buffer (and the
        ``extra_sends`` layouts of strict mode, whose branch is chosen later, likewise), so no level is compressed
        twice. Nothing here changes any state."""
        st = stats if stats is not None else EncodeStats(nums=[0.0] * len(probes))
        lay = self.layout(send) if send is not None else None
        extra = [self.layout(t) for t in extra_sends]
        multilevel = self.comp.multilevel != Multilevel.NONE
        base = float(probes[0]) if probes and live[0] else None
        for i in range(*(span or (0, len(self.ctxs)))):
            mem, x, ctx = self.bucket.members[i], xs[i], self.ctxs[i]
            direct: dict[float, Payload] = {}
            if lay is not None:
                direct[send[i]] = lay.payloads[i]
            for t, extra_lay in zip(extra_sends, extra):
                direct.setdefault(t[i], extra_lay.payloads[i])
            measured = [float(p) for p, ok in zip(probes, live) if ok]
            levels = list(dict.fromkeys(([base] if base is not None else []) + measured + list(direct)))
            p_base: Optional[Payload] = None
            for lvl in levels:
                t0 = time.perf_counter()
                plan = self.comp.tensor_plan(mem.param.shape, lvl)
                target = direct.get(lvl) or self._probe_payload(i, "base" if lvl == base else "other", plan)
                if p_base is not None and multilevel and lvl > base and plan.k <= p_base.plan.k:
                    self.comp.compress_from(p_base, x, plan, target, ctx)
                else:
                    self.comp.compress(x, plan, target, ctx, update_state=False)
                if lvl == base:
                    p_base = target
                if lvl in measured:
                    st.add_sent_norm(lvl, scalar(self.comp.sent_sq_norm(target, ctx)), probes, live)
                dt = time.perf_counter() - t0
                st.compress_s += dt
                if lvl not in direct:
                    st.probe_s += dt
        return lay, st

    def leave_memory(self, xs: Sequence[torch.Tensor], lay: SendLayout, span: Optional[tuple[int, int]] = None
                     ) -> None:
        """Turn each staged input (of ``span``'s members) in place into the memory it leaves after sending ``lay``
        (``compressor.commit``: ``x − D(p)``, or the compressor's own rule). Only the step's scratch changes."""
        for i in range(*(span or (0, len(self.ctxs)))):
            self.comp.memory.commit(xs[i], lay.payloads[i], self.ctxs[i])

    # ---- rounds and decode ----------------------------------------------------------------------------------
    def next_round(self, lay: SendLayout) -> None:
        """Two-round patterns: each member's second-round payload from the first round's reduced one."""
        for p1, p2, ctx in zip(lay.payloads, lay.round2_payloads, self.ctxs):
            self.comp.next_round(ctx.residual, p1, p2, ctx)

    def decode_rounds(self, lay: SendLayout, out: torch.Tensor, scale: float) -> None:
        """Two-round patterns: ``out = scale · D(Σ round 1, Σ round 2)`` per member."""
        second = lay.round2_payloads or [None] * len(lay.payloads)    # every member plain: no second round
        for i, (p1, p2) in enumerate(zip(lay.payloads, second)):
            self.comp.decompress_rounds(p1, p2, self.seg(out, i), scale, self.ctxs[i])

    def commit_aggregate(self, lay: Optional[SendLayout], out: torch.Tensor) -> None:
        """After the agreement and the decode: memory and replicated state that depend on the aggregate ``out``
        (``lay`` None: the bucket went dense and ``out`` is the exact average)."""
        if lay is None:
            for i, ctx in enumerate(self.ctxs):
                self.comp.memory.commit_aggregate(ctx.residual, self.seg(out, i), [], ctx)
            return
        second = lay.round2_payloads or [None] * len(lay.payloads)
        for i, (p1, p2, ctx) in enumerate(zip(lay.payloads, second, self.ctxs)):
            self.comp.memory.commit_aggregate(ctx.residual, self.seg(out, i), [p1] if p2 is None else [p1, p2], ctx)

    def _out(self, lay: SendLayout, out: torch.Tensor, i: int) -> tuple[torch.Tensor, CompressCtx]:
        """Member ``i`` of ``lay`` (a chunk's layout counts from its first member): its segment of ``out``, which
        starts at the layout's first element, and its context."""
        m = self.bucket.members[lay.first + i]
        return out[m.offset - lay.elem0:m.offset - lay.elem0 + m.numel], self.ctxs[lay.first + i]

    def decode_sum(self, lay: SendLayout, out: torch.Tensor, scale: float) -> None:
        """``out = scale · D(Σ_w p_w)`` for summable payloads (the send buffer holds the reduced sum)."""
        for i, p in enumerate(lay.payloads):
            seg, ctx = self._out(lay, out, i)
            self.comp.decompress(p, seg, accumulate=False, scale=scale, ctx=ctx)

    def decode_rows(self, lay: SendLayout, rows: torch.Tensor, out: torch.Tensor, scale: float, bulk: bool) -> None:
        """``out = scale · Σ_w D(row_w)``, rows in rank order (one ``index_add_`` per bucket for sparse rows)."""
        out.zero_()
        if bulk and lay.bulk_idx_pos is not None:
            idx = (rows.index_select(1, lay.bulk_idx_pos) + lay.bulk_offsets).view(-1)
            val = rows.index_select(1, lay.bulk_val_pos).view(torch.float32).view(-1)
            out.index_add_(0, idx, val, alpha=scale)
            return
        for w in range(rows.shape[0]):
            for i, (plan, off) in enumerate(zip(lay.plans, lay.word_offsets)):
                seg, ctx = self._out(lay, out, i)
                self.comp.decompress(Payload(plan, rows[w, off:off + plan.words]), seg, accumulate=True,
                                     scale=scale, ctx=ctx)

    # ---- checks -----------------------------------------------------------------------------------------
    def shared_selection_digest(self, levels: tuple[float, ...]) -> int:
        """Checksum of shared-stream selections (Random-k indices), to catch a seed or RNG mismatch early."""
        total = 0
        for mem, ctx, lvl in zip(self.bucket.members, self.ctxs, levels):
            idx = self.comp.indices(mem.numel, self.comp.tensor_plan(mem.param.shape, lvl), ctx)
            total = stable_hash(f"{total}:{int(idx.long().sum())}:{int((idx.long() * 2654435761 % 1000003).sum())}")
        return total


_EMPTY = TensorPlan(0, 1.0, 0, (), 0)      # a member without a second-round payload (sent plain)


def _is_sparse_fp32(plan: TensorPlan) -> bool:
    names = {s.name: s for s in plan.sections}
    return (set(names) == {"idx", "val"} and names["val"].dtype == torch.float32
        and names["idx"].dtype == torch.int32)
