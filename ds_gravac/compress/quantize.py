"""Shared machinery of the quantizers (the ``QUANTIZED`` kind): static plans, seeded streams, error feedback, and
the owner's half of the parameter-server exchange.

Every quantizer encodes one *partition* of ``L`` elements (a slice of a bucket's flat buffer, possibly spanning
several tensors) into a payload of statically known size: fp32 header sections first (scales, min/max, norms),
then the packed codes (``ds_gravac.compress.bitpack``). The level is a compression factor snapped to the
compressor's grid; the plan's ``level`` is the realized CF.

Exchange protocol. Rank ``w`` encodes its slice of partition ``j`` with :meth:`Quantizer.compress` and sends it
to the owner ``j``. The owner, with the payloads of all ``N`` ranks in rank order and a scratch ``y`` of ``L``
fp32 elements, runs::

    comp.merge_decode(payloads, y, ctx, server_residual=s_j)   # y = (1/N)·Σ_w D(p_w) + s_j   (s_j may be None)
    comp.server_encode(y, plan, q, ctx)                        # pure re-encode of the merged partition
    if comp.server_error_feedback:                             # and the section-level switch is on
        comp.server_commit(y, q, ctx)                          # y ← y − D(q): the next s_j, adopt after agreement

after which ``q`` is all-gathered and every rank, the owner included, decodes ``G_j = D(q)`` with
``scale = 1`` (the average is already inside ``q``; never use ``y``, or replicas drift apart). With ``ctx.rank``
= the owner's rank, stochastic re-encoding draws from the server's own stream, distinct from the owner's worker
stream. ``signsgd`` merges differently (a majority vote, see its module); the protocol is the same.

Error feedback. ``worker_error_feedback`` / ``server_error_feedback`` report the compressor's own default (its
``error_feedback`` parameter); the synchronizer ANDs them with the section-level switch. With worker EF off but a
residual view supplied, :meth:`Quantizer.commit` leaves zeros in it (the memory such a compressor keeps), so
a generic memory that adopts the scratch never accumulates stale input. Compressors with their own memory
(:class:`OwnMemoryQuantizer`: TBQ, EF-signSGD) keep one slot that is also their input slot.

Cost. Encoders sweep the partition in cache-sized blocks through the compressor's :class:`Workspace`
(``ds_gravac.compress.qkernels``), and every decode — the worker's error feedback, the owner's merge of N rows,
the final decode — is one :meth:`Quantizer.decode_sum` sweep that writes or accumulates in place, never a
decoded temporary of the partition's size.
"""
from __future__ import annotations

from typing import ClassVar, Optional, Sequence

import torch

from . import qkernels
from .counter_rng import CounterStream
from .device_path import host_kernels
from .base import (CompressCtx, Compressor, CompressorParams, Kind, Payload, Section, TensorPlan, mix_seed,
                   stable_hash)
from .kinds import GainKind, LevelKind, Multilevel
from .memory import ResidualMemory, SwitchedErrorFeedback
from .qkernels import Workspace

Tensor = torch.Tensor

# Stream ids of the dedicated generators (rank-local stochastic rounding). The server's re-encode of a merged
# partition XORs SERVER_STREAM into the id, so an owner's worker and server draws are independent.
STREAM_TERNGRAD = 0x7467_7264
STREAM_TERNARY = 0x7465_726E
STREAM_QSGD = 0x7173_6764
SERVER_STREAM = 1 << 40

FP32_MAX = torch.finfo(torch.float32).max


class Quantizer(Compressor):
    """Base of the ``QUANTIZED`` compressors: plan from :meth:`sections`, encode with :meth:`encode`."""

    kind = Kind.QUANTIZED
    server_reencode = True
    exchange = "casync_ps"        # ds_gravac.sync.exchange: all-to-all, owner merge and re-encode, all-gather
    Memory = SwitchedErrorFeedback   # worker EF on the compressor's ``error_feedback`` switch
    multilevel = Multilevel.NONE
    level_kind = LevelKind.CF
    gain_kind = GainKind.NONE
    GRID: ClassVar[tuple[float, ...]] = (32.0,)
    CODES: ClassVar[str] = "codes"     # the payload section holding the packed codes

    def __init__(self, params: Optional[CompressorParams] = None) -> None:
        super().__init__(params)
        self._hashes: dict[str, int] = {}
        self._gens: dict[tuple[str, int], torch.Generator] = {}
        self.ws = Workspace()         # per-call scratch of the block kernels (ds_gravac.compress.qkernels)

    # ---- levels and plans -----------------------------------------------------------------------------
    def cf_grid(self) -> Optional[list[float]]:
        return sorted(self.GRID)

    def default_level(self) -> Optional[float]:
        return self.default_cf()

    def default_cf(self) -> float:
        """The CF these parameters ask for (what static mode should use when no ``cf`` is configured)."""
        return float(self.GRID[0])

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        """Static wire layout of one partition of ``numel`` elements at the realized CF ``theta``."""
        raise NotImplementedError

    def plan_extra(self, theta: float) -> tuple[tuple[str, object], ...]:
        """Knobs derived from the level (bit width, QSGD levels) that decode needs without recomputation."""
        return ()

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        if numel < 1:
            raise ValueError(f"ds_gravac: {self.name} cannot plan an empty partition")
        theta = self.realize_cf(level)
        return TensorPlan(numel, theta, numel, self.sections(numel, theta), values_sent=numel,
                          extra=self.plan_extra(theta))

    # ---- error feedback switches ------------------------------------------------------------------------
    @property
    def worker_error_feedback(self) -> bool:
        return bool(self.params.error_feedback)

    @property
    def server_error_feedback(self) -> bool:
        return self.worker_error_feedback

    # ---- randomness -------------------------------------------------------------------------------------
    def stream(self, x: Tensor, ctx: CompressCtx, stream: int, server: bool) -> qkernels.Stream:
        """Rank-local stream for ``(seed, step, key, stream[, server], rank)``; re-seeded on every call, so
        callers draw from it immediately and never hold it across another request. The device path draws from a
        counter-based stream of the same seed instead of a generator (``counter_rng``)."""
        h = self._hashes.get(ctx.key)
        if h is None:
            h = self._hashes[ctx.key] = stable_hash(ctx.key)
        sid = stream ^ SERVER_STREAM if server else stream
        if not host_kernels(x):
            return CounterStream(mix_seed(ctx.seed, ctx.step, h, sid, ctx.rank))
        slot = (str(x.device), sid)
        gen = self._gens.get(slot)
        if gen is None:
            gen = self._gens[slot] = torch.Generator(device=x.device)
        gen.manual_seed(mix_seed(ctx.seed, ctx.step, h, sid, ctx.rank))
        return gen

    def scratch(self, x: Tensor, step: int, *names: str) -> list[Tensor]:
        """One reusable block buffer per name, ``min(step, len(x))`` elements of x's dtype on x's device."""
        return [self.ws.get(name, min(step, x.numel()), x.dtype, x.device) for name in names]

    def draws(self, gen: qkernels.Stream, count: int, device: torch.device) -> Tensor:
        """The next ``count`` draws of ``gen`` (those ``torch.rand`` would give), in a reused fp32 buffer."""
        return qkernels.uniform_(gen, self.ws.get("u", count, torch.float32, device), self.ws)

    # ---- encode / decode ----------------------------------------------------------------------------------
    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        """Write the payload of the flat partition ``x`` (pure; ``server`` selects the server's stream)."""
        raise NotImplementedError

    def compress(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[Tensor]:
        x = x.detach().reshape(-1)
        self.encode(x, plan, out, ctx, server=False)
        if update_state:
            self.memory.commit(x, out, ctx)
        return None

    def server_encode(self, y: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx) -> None:
        """Re-encode the owner's merged partition ``y`` (never mutates; default: the worker encoding)."""
        self.encode(y.detach().reshape(-1), plan, out, ctx, server=True)

    # ---- decoding (ds_gravac.compress.qkernels) ----------------------------------------------------------
    def code_bits(self, plan: TensorPlan) -> int:
        """Width of the packed codes of section :attr:`CODES`."""
        raise NotImplementedError

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        """The ``2^bits`` values code ``c`` decodes to (times ``scale``), in ``dtype``, computed with exactly the
        arithmetic an elementwise decode would use, so a table decode is bitwise the same."""
        raise NotImplementedError

    def decoder(self, p: Payload, dtype: torch.dtype, scale: float) -> qkernels.Decoder:
        """How ``scale·D(p)`` is written block by block (default: a table of :meth:`code_levels`)."""
        return qkernels.TableDecoder(self.code_levels(p, dtype, scale), self.code_bits(p.plan))

    def decode_sum(self, payloads: Sequence[Payload], out: Tensor, scale: float, mode: str,
                   residual: Optional[Tensor] = None) -> None:
        """``out (=|= 0 +|+=) scale·Σ_w D(p_w) (+ residual)`` in rank order (modes of
        :func:`ds_gravac.compress.qkernels.decode_sum`): one sweep over ``out`` for all the payloads."""
        decoders = [self.decoder(p, out.dtype, scale) for p in payloads]
        qkernels.decode_sum(decoders, [p[self.CODES].view(torch.uint8) for p in payloads], payloads[0].plan.numel,
                            out.reshape(-1), mode, self.ws, residual)

    def decompress(self, p: Payload, out: Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        self.decode_sum([p], out, scale, "add" if accumulate else "set")

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        """``‖D(p)‖²`` block by block (the gain numerator, which ``static`` mode measures every step too unless
        ``log_interval`` is 0): the generic decode into a fresh partition-sized tensor and its float64 copy cost
        twice a whole encode."""
        return qkernels.decoded_sq_norm(self.decoder(p, torch.float32, 1.0), p[self.CODES].view(torch.uint8),
                                        p.plan.numel, self.ws)

    def merge_decode(self, payloads: Sequence[Payload], y: Tensor, ctx: CompressCtx,
                     server_residual: Optional[Tensor] = None) -> None:
        """The owner's merge: ``y = (1/N)·Σ_w D(p_w) (+ s)``, ``N = len(payloads)``, in one sweep."""
        self.decode_sum(payloads, y, 1.0 / len(payloads), "zero", server_residual)

    def server_commit(self, y: Tensor, q: Payload, ctx: CompressCtx) -> None:
        """Turn the merged partition ``y`` in place into the server residual left after sending ``q``:
        ``y − D(q)``, or zeros when this compressor keeps no server residual."""
        if self.server_error_feedback:
            self.decompress(q, y, accumulate=True, scale=-1.0, ctx=ctx)
        else:
            y.zero_()


class OwnMemoryQuantizer(Quantizer):
    """A quantizer with one memory slot that is also its input (TBQ's residual, EF-signSGD's update-space
    error): its Memory forms ``x = gain·g + m`` and turns x in place into ``x − D(p)`` (:class:`ResidualMemory`)."""

    owns_state = True
    Memory = ResidualMemory

    @property
    def worker_error_feedback(self) -> bool:
        return True   # the memory is the algorithm, not an option

    def input_gain(self, ctx: CompressCtx) -> float:
        """Factor applied to the gradient before the memory is added (1; EF-signSGD: the learning rate)."""
        return 1.0


# ---- small shared helpers --------------------------------------------------------------------------------
def emit(out: Tensor, values: Tensor, accumulate: bool) -> None:
    """``out (+)= values`` — the fused decode-and-merge every ``decompress`` ends with."""
    if accumulate:
        out.add_(values)
    else:
        out.copy_(values)


def put_header(view: Tensor, *values: Tensor) -> None:
    """Store per-partition scalars (0-d tensors, any float dtype) into an fp32 header section."""
    view.copy_(torch.stack([v.reshape(()).to(view.dtype) for v in values]))


def theta_bits(theta: float) -> int:
    """Bit width of a nominal CF ``32/bits``."""
    return int(round(32.0 / theta))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["Quantizer", "OwnMemoryQuantizer", "emit", "put_header", "theta_bits", "ceil_div",
           "STREAM_TERNGRAD", "STREAM_TERNARY", "STREAM_QSGD", "SERVER_STREAM", "FP32_MAX"]
