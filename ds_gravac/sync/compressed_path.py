"""A compressible bucket's step: stage ``g + r``, encode at the sent and probed levels, exchange, decode.

Buffers are allocated once per bucket (staging, residual, output) and per (bucket, level tuple) (payloads), so
the hot path does not allocate after the first step at a given level (synchronization.md §3, §11).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from ..compress.base import CompressCtx, Compressor, Kind, Payload, TensorPlan
from ..compress.sparse_select import zero_at
from .buckets import Bucket, Member
from .collectives import Work, all_gather_async, all_reduce_async, allgather_bytes, ring_allreduce_bytes
from .dense_path import DenseReduce, ReduceRule


@dataclass
class SendLayout:
    """Payload layout of one bucket at one tuple of per-member levels."""

    plans: list[TensorPlan]
    word_offsets: list[int]
    words: int
    send: torch.Tensor
    gathered: Optional[torch.Tensor]
    payloads: list[Payload]
    bulk_idx_pos: Optional[torch.Tensor] = None
    bulk_val_pos: Optional[torch.Tensor] = None
    bulk_offsets: Optional[torch.Tensor] = None
    values_sent: int = 0


@dataclass
class BucketStepStats:
    den: float = 0.0
    den_raw: float = 0.0
    nums: list[float] = field(default_factory=list)
    values_sent: int = 0
    bytes_sent: float = 0.0
    nonfinite: int = 0
    compress_s: float = 0.0
    probe_s: float = 0.0
    stage_s: float = 0.0


class CompressedBucket:
    """State and step logic of one bucket whose members are all compressible."""

    def __init__(self, bucket: Bucket, compressor: Compressor, rank: int, world_size: int, seed: int,
                 error_feedback: bool, ctx_factory: Callable[[Member], CompressCtx]) -> None:
        self.bucket = bucket
        self.comp = compressor
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        device = bucket.members[0].param.device
        self.device = device
        m = bucket.numel
        self.staging = torch.zeros(m, dtype=torch.float32, device=device)
        self.external_ef = error_feedback and not compressor.owns_state
        self.residual = torch.zeros(m, dtype=torch.float32, device=device) if self.external_ef else None
        self.out = torch.zeros(m, dtype=torch.float32, device=device)
        # ``out`` is rewritten only by the next decode, after that step's gradients were staged, and DeepSpeed
        # drops p.grad (set to None) after each step, so fp32 contiguous p.grad can simply be views of ``out``
        # (the idea of DDP's gradient_as_bucket_view); ``staging`` cannot: a dense step swaps it with the residual.
        # After a sparse decode only these flat positions of ``out`` are non-zero, so the next decode clears
        # them instead of the whole buffer (None: clear everything).
        self._dirty: Optional[torch.Tensor] = None
        self._can_alias = [mem.param.dtype == torch.float32 and mem.param.is_contiguous() for mem in bucket.members]
        self.ctxs = [ctx_factory(mem) for mem in bucket.members]
        self.inputs: list[torch.Tensor] = []
        self._layouts: dict[tuple[float, ...], SendLayout] = {}
        self._scratch: dict[tuple[int, float], Payload] = {}
        self.pending: Any = None          # ("dense", DenseReduce) | ("sparse"/"summable", Work, SendLayout)

    # ---- buffers ------------------------------------------------------------------------------------
    @property
    def x_buf(self) -> torch.Tensor:
        """Where :meth:`stage` forms x. With error feedback g is added to the residual in place, so x *is* the
        residual and commit's ``x − D(p)`` leaves the new residual there (in-place add: one read of g and one
        read-modify-write, measured 1.5x faster than writing ``g + r`` into a third buffer)."""
        return self.residual if self.external_ef else self.staging

    def _seg(self, buf: torch.Tensor, i: int) -> torch.Tensor:
        mem = self.bucket.members[i]
        return buf[mem.offset:mem.offset + mem.numel]

    def layout(self, levels: tuple[float, ...]) -> SendLayout:
        lay = self._layouts.get(levels)
        if lay is None:
            lay = self._build_layout(levels)
            self._layouts[levels] = lay
        return lay

    def _build_layout(self, levels: tuple[float, ...]) -> SendLayout:
        plans = [self.comp.plan(mem.numel, lvl) for mem, lvl in zip(self.bucket.members, levels)]
        offsets, total = [], 0
        for p in plans:
            offsets.append(total)
            total += p.words
        summable = self.comp.kind == Kind.SUMMABLE
        send = torch.zeros(total, dtype=torch.float32 if summable else torch.int32, device=self.device)
        gathered = None if summable else torch.zeros(self.world_size * total, dtype=torch.int32,
                                                     device=self.device)
        payloads = [Payload(p, send[o:o + p.words]) for p, o in zip(plans, offsets)]
        lay = SendLayout(plans, offsets, total, send, gathered, payloads,
                         values_sent=sum(p.values_sent for p in plans))
        if not summable and all(_is_sparse_fp32(p) for p in plans):
            idx_pos, val_pos, offs = [], [], []
            for mem, p, o in zip(self.bucket.members, plans, offsets):
                io, vo = o + p.offset_of("idx"), o + p.offset_of("val")
                idx_pos.append(torch.arange(io, io + p.k))
                val_pos.append(torch.arange(vo, vo + p.k))
                offs.append(torch.full((p.k,), mem.offset, dtype=torch.int64))
            lay.bulk_idx_pos = torch.cat(idx_pos).to(self.device)
            lay.bulk_val_pos = torch.cat(val_pos).to(self.device)
            lay.bulk_offsets = torch.cat(offs).to(self.device)
        return lay

    def scratch(self, i: int, plan: TensorPlan) -> Payload:
        key = (i, plan.level)
        p = self._scratch.get(key)
        if p is None or p.plan != plan:
            dtype = torch.float32 if self.comp.kind == Kind.SUMMABLE else torch.int32
            p = Payload.allocate(plan, dtype, self.device)
            self._scratch[key] = p
        return p

    # ---- per-step phases ----------------------------------------------------------------------------
    def stage(self, step: int, collect: Optional[Callable[[str, torch.Tensor], None]], raw_den: bool,
              stats: BucketStepStats) -> None:
        """Form the compressor inputs: ``x = g + r`` (in place) or the compressor's compensated input.

        ``‖x‖²`` is summed per member right after x is written, while it is still in cache (measured ~10% cheaper
        than one more pass over the whole bucket)."""
        t0 = time.perf_counter()
        self.inputs = []
        xbuf = self.x_buf
        squares = []
        for i, mem in enumerate(self.bucket.members):
            g = mem.param.grad.detach().view(-1)
            if self._dirty is not None and _same_storage(g, self.out):
                self._dirty = None        # p.grad was not released: autograd accumulated into ``out``
            ctx = self.ctxs[i]
            ctx.step = step
            x = self._seg(xbuf, i)
            ctx.residual = x if self.external_ef else None
            if collect is not None:
                collect(mem.name, g.float())
            if raw_den:
                stats.den_raw += float(torch.dot(g.float(), g.float()))
            if self.comp.owns_state:
                x.copy_(self.comp.compensate(g.float(), ctx))
            elif self.external_ef:
                x.add_(g)
            else:
                x.copy_(g)
            squares.append(torch.dot(x, x))
            self.inputs.append(x)
        den = float(torch.stack(squares).double().sum())
        if den != den or den in (float("inf"), float("-inf")):
            stats.nonfinite += 1
        stats.den += den
        stats.stage_s += time.perf_counter() - t0

    def encode(self, send_levels: Optional[tuple[float, ...]], probes: Sequence[float],
               probe_fallback: Sequence[bool], stats: BucketStepStats) -> Optional[SendLayout]:
        """Encode every member at its send level (into the send buffer, then commit the state update) and at
        each probe level (gains only). ``send_levels=None``: this bucket is sent dense, probes only."""
        lay = self.layout(send_levels) if send_levels is not None else None
        if len(stats.nums) < len(probes):
            stats.nums.extend([0.0] * (len(probes) - len(stats.nums)))
        live = [p for p, fb in zip(probes, probe_fallback) if not fb]
        for i, mem in enumerate(self.bucket.members):
            x, ctx = self.inputs[i], self.ctxs[i]
            send = send_levels[i] if send_levels is not None else None
            prev: Optional[Payload] = None
            for lvl in sorted(set(live) | ({send} if send is not None else set())):
                t0 = time.perf_counter()
                plan = self.comp.plan(mem.numel, lvl)
                target = lay.payloads[i] if lvl == send else self.scratch(i, plan)
                if prev is not None and self.comp.multilevel != "none" and plan.k <= prev.plan.k:
                    self.comp.compress_from(prev, x, plan, target, ctx)
                else:
                    self.comp.compress(x, plan, target, ctx, update_state=False)
                if lvl in live:
                    norm = float(self.comp.sent_sq_norm(target, ctx))
                    for slot, (p, fb) in enumerate(zip(probes, probe_fallback)):
                        if p == lvl and not fb:
                            stats.nums[slot] += norm
                dt = time.perf_counter() - t0
                stats.compress_s += dt
                if lvl != send:
                    stats.probe_s += dt
                prev = target
            if lay is not None:
                self.comp.commit(x, lay.payloads[i], ctx)     # external EF: x − D(p) in place = new residual
        return lay

    def add_dense_probe_nums(self, probes: Sequence[float], probe_fallback: Sequence[bool], den: float,
                             stats: BucketStepStats) -> None:
        """Probe levels at which this bucket would be sent dense count ``‖x‖²`` fully (gravac.md §1.3)."""
        if len(stats.nums) < len(probes):
            stats.nums.extend([0.0] * (len(probes) - len(stats.nums)))
        for slot, fb in enumerate(probe_fallback):
            if fb:
                stats.nums[slot] += den

    def launch_compressed(self, lay: SendLayout, group: Any, stats: BucketStepStats) -> None:
        if self.comp.kind == Kind.SUMMABLE:
            work = all_reduce_async(lay.send, group)
            stats.bytes_sent += ring_allreduce_bytes(4 * lay.words, self.world_size)
            self.pending = ("summable", work, lay)
        else:
            work = all_gather_async(lay.gathered, lay.send, group)
            stats.bytes_sent += allgather_bytes(4 * lay.words, self.world_size)
            self.pending = ("sparse", work, lay)
        stats.values_sent += lay.values_sent

    def launch_dense(self, rule: ReduceRule, group: Any, stats: BucketStepStats) -> None:
        """Dense send of the compensated input; the memory is cleared (compressors.md §1 rule 1)."""
        if self.external_ef:                      # x lives in the residual buffer: send it, clear the other one
            self.staging, self.residual = self.residual, self.staging
            self.residual.zero_()
        elif self.comp.owns_state:
            for ctx in self.ctxs:
                self.comp.dense_sent(ctx)
        red = DenseReduce([], rule, group, flat=self.staging)
        stats.bytes_sent += ring_allreduce_bytes(red.payload_bytes, self.world_size)
        stats.values_sent += self.bucket.numel
        self.pending = ("dense", red)

    def finish(self, scale: float, bulk: bool) -> tuple[float, float, float]:
        """Wait, decode into ``out`` and write ``p.grad``. Returns (comm wait, decompress, write-back) seconds."""
        kind = self.pending[0]
        waited = self.pending[1].wait()
        t0 = time.perf_counter()
        if kind == "dense":
            src = self.staging
        else:
            lay = self.pending[2]
            src = self.out
            if kind == "summable":
                self._dirty = None
                for i, p in enumerate(lay.payloads):
                    self.comp.decompress(p, self._seg(self.out, i), accumulate=False, scale=scale, ctx=self.ctxs[i])
            else:
                self._decode_gathered(lay, scale, bulk)
        t1 = time.perf_counter()
        for i, mem in enumerate(self.bucket.members):
            seg = self._seg(src, i).view_as(mem.param)
            if src is self.out and self._can_alias[i]:
                mem.param.grad = seg      # the decoded gradient *is* p.grad: no write-back pass
            else:
                mem.param.grad.copy_(seg)
        self.pending = None
        return waited, t1 - t0, time.perf_counter() - t1

    def _decode_gathered(self, lay: SendLayout, scale: float, bulk: bool) -> None:
        rows = lay.gathered.view(self.world_size, lay.words)
        if self._dirty is not None:
            zero_at(self.out, self._dirty)
        else:
            self.out.zero_()
        if bulk and lay.bulk_idx_pos is not None:
            idx = (rows.index_select(1, lay.bulk_idx_pos).long() + lay.bulk_offsets).view(-1)
            val = rows.index_select(1, lay.bulk_val_pos).view(torch.float32).view(-1)
            self.out.index_add_(0, idx, val, alpha=scale)
            # Scattered clearing pays below ~5% density (measured on one CPU core: ~13 ns per position vs
            # ~0.45 ns per element for a full clear of an uncached buffer). A non-finite value could spread to
            # every entry (e.g. clipping by a NaN norm), so then everything is cleared next time.
            sparse = idx.numel() * 20 < self.out.numel()
            self._dirty = idx if sparse and bool(torch.isfinite(val).all()) else None
            return
        self._dirty = None
        for w in range(self.world_size):
            for i, (plan, off) in enumerate(zip(lay.plans, lay.word_offsets)):
                p = Payload(plan, rows[w, off:off + plan.words])
                self.comp.decompress(p, self._seg(self.out, i), accumulate=True, scale=scale, ctx=self.ctxs[i])

    def sparse_payload_pays(self, levels: tuple[float, ...], rule: ReduceRule) -> bool:
        """Break-even rule (synchronization.md §5.3): all-gather only while it moves fewer bytes than dense."""
        if self.comp.kind == Kind.SUMMABLE:
            return True
        words = sum(self.comp.plan(m.numel, lvl).words for m, lvl in zip(self.bucket.members, levels))
        n = self.world_size
        return (n - 1) * 4 * words < 2.0 * (n - 1) / n * rule.comm_bytes_per_element * self.bucket.numel

    def reset_memory(self) -> None:
        if self.residual is not None:
            self.residual.zero_()
        if self.comp.owns_state:
            for ctx in self.ctxs:
                self.comp.reset(ctx)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _is_sparse_fp32(plan: TensorPlan) -> bool:
    names = {s.name: s for s in plan.sections}
    return set(names) == {"idx", "val"} and names["val"].dtype == torch.float32 \
        and names["idx"].dtype == torch.int32
