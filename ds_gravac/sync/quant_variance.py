"""The variance QSGD would add at each of its levels, per layer group, agreed (``mode: "auto"`` over a quantizer).

Why: an unbiased quantizer delays nothing, it adds noise. QSGD at ``s`` levels rounds ``v_i = s·x_i/ν_b`` (ν_b
the L2 norm of block b) to a neighbouring integer with probability its distance to the other one, so a rank adds
``(ν_b/s)² Σ_{i∈b} p_i(1 − p_i)`` per block (``adapt/auto/error_model.qsgd_variance``), and the ranks round
independently, so the averaged update carries

    V_g(s) = N⁻² Σ_ranks Σ_{blocks of g} (ν_b/s)² Σ_i p_i(1 − p_i)

— for every level at once, from the compensated input before anything is encoded, on a uniform sample of
``BLOCKS`` blocks per bucket partition (scaled up: unbiased; the blocks are those the codec forms, ``B`` values
of one partition of ``L = ceil(n_b/N)``). The group's signal energy comes free with the exchange: every rank
decodes the same mean ``Q̄_g``, and ``E‖Q̄_g‖² = ‖x̄_g‖² + V_g(sent)``, so ``S_g = ‖Q̄_g‖² − V_g(sent)`` (exact on
a dense step). A step then makes ``S/(S + V)`` of a dense step's progress.

Each group must own its buckets (``VarianceSpec.bucketed``: the bucket plan does not mix groups), since a
quantizer encodes a bucket at one level. The model is the all-gather exchange (N = 2 here); CaSync-PS (N > 2)
re-rounds the owners' means, whose extra variance this does not count.

Like ``aggregate_gain``, step i's measurement travels in step i + 1's statistics vector: rank 0's ``‖Q̄_g‖²``
(the same on every rank) and the rank-order sums of the ranks' variance terms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from ..compress.base import stable_hash
from .host_values import all_finite
from .server_memory import partition_size

if TYPE_CHECKING:
    from .buckets import Bucket
    from .planner import Planner
    from .step_plan import StepPlan

BLOCKS = 64            # sampled blocks per bucket partition and step (every block of a smaller partition)
F64 = torch.float64


@dataclass(frozen=True)
class VarianceSpec:
    """A controller's groups over a quantizer: member name → group, and the levels measured (QSGD's CFs and their
    ``s``, in ladder order)."""

    members: dict[str, int]
    count: int
    cfs: tuple[float, ...]
    s: tuple[int, ...]
    block: int
    bucketed: bool = True

    @property
    def width(self) -> int:
        return self.count * (2 + len(self.s))      # ‖Q̄_g‖², one term per level, the terms of the levels sent


@dataclass(frozen=True)
class VarianceSignal:
    """One group's agreed terms of one step: ``energy`` ``S_g``, ``applied`` ``‖Q̄_g‖²``, ``variance`` ``V_g(s)``
    per level of the spec."""

    energy: float
    applied: float
    variance: tuple[float, ...]

    @property
    def per_level(self) -> tuple[float, ...]:
        return self.variance


@dataclass(frozen=True)
class VarianceSample:
    """One step's agreed per-group signals."""

    step: int
    groups: tuple[VarianceSignal, ...]


def block_variance(x: torch.Tensor, s: torch.Tensor, block: int, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """``Σ_blocks (ν_b/s)² Σ_i p_i(1 − p_i)`` of one partition ``x`` (zero-padded to whole blocks) for every
    ``s`` at once, float64; ``rows``: a uniform sample of block indices, scaled up to all blocks."""
    flat = x.detach().reshape(-1).to(F64)
    total = -(-flat.numel() // block)
    if total == 0:
        return torch.zeros(s.numel(), dtype=F64, device=x.device)
    mat = torch.nn.functional.pad(flat, (0, total * block - flat.numel())).view(total, block)
    if rows is not None:
        mat = mat.index_select(0, rows.to(mat.device))
    nu = torch.linalg.vector_norm(mat, dim=1, keepdim=True)
    unit = mat / torch.where(nu > 0, nu, torch.ones_like(nu))          # x/ν, in [−1, 1]
    v = unit.unsqueeze(0) * s.view(-1, 1, 1)                           # levels × blocks × B
    p = v - torch.floor(v)
    per_block = (nu.view(1, -1) / s.view(-1, 1)).square() * (p * (1.0 - p)).sum(dim=2)
    scale = total / mat.shape[0] if rows is not None and mat.shape[0] else 1.0
    return per_block.sum(dim=1) * scale


class QuantVariance:
    """Collects one step's per-group variance terms on this rank; turns the gathered vectors into agreed signals.
    The same interface as ``AggregateGain`` where the synchronizer and the statistics use it."""

    def __init__(self, planner: "Planner", spec: VarianceSpec, seed: int, world_size: int) -> None:
        self.planner, self.spec, self.seed, self.world_size = planner, spec, seed, world_size
        self.levels = len(spec.s)
        self.width = 1 + spec.width            # step, then per group: ‖Q̄_g‖², one term per level, the sent terms
        members = [m for m in planner.members if m.compressible]
        self.device = members[0].param.device if members else torch.device("cpu")
        self._s = torch.tensor([float(v) for v in spec.s], dtype=F64, device=self.device)
        self._report = self._empty()
        self._pending: Optional[torch.Tensor] = None      # the last step's row, still on the device ...
        self._pending_step = -1                           # ... and its step

    def _empty(self) -> torch.Tensor:
        out = torch.zeros(self.width, dtype=F64)
        out[0] = -1.0
        return out

    def _group(self, bucket: "Bucket") -> int:
        return self.spec.members.get(bucket.members[0].name, -1)

    # ---- during the step ------------------------------------------------------------------------------
    def begin(self, step: int, plan: "StepPlan") -> None:
        """The step's accumulators, and the level each bucket is sent at (from the plan: agreed; −1 dense)."""
        self.step = int(step)
        # per group ‖Q̄_g‖², its variance terms, and the terms of the levels its buckets were sent at: device
        # values, read once with the next step's statistics
        self._row = torch.zeros(self.spec.count, 2 + self.levels, dtype=F64, device=self.device)
        self._bucket_sent: dict[int, int] = {}
        for bucket, action in zip(self.planner.plan.buckets, plan.actions):
            cf = float(min(action.levels)) if action.compressed and action.levels else 0.0
            self._bucket_sent[bucket.index] = self.spec.cfs.index(cf) if cf in self.spec.cfs else -1

    def stage(self, b: int, flat_x: torch.Tensor) -> None:
        """The bucket's compensated input, before anything is encoded: every level's variance terms."""
        bucket = self.planner.plan.buckets[b]
        g = self._group(bucket)
        if g < 0:
            return
        n, block = bucket.numel, self.spec.block
        size = partition_size(n, self.world_size)
        gen = torch.Generator(device=flat_x.device)
        gen.manual_seed(stable_hash(f"quant-variance:{self.seed}:{self.step}:{b}") & (2**62 - 1))
        terms = torch.zeros(self.levels, dtype=F64, device=self.device)
        for j in range(self.world_size):
            part = flat_x[j * size:min((j + 1) * size, n)]
            blocks = -(-part.numel() // block)     # the real partition's (the codec's zero padding adds nothing)
            if blocks == 0:
                continue
            rows = None
            if blocks > BLOCKS:
                rows = torch.randperm(blocks, generator=gen, device=flat_x.device)[:BLOCKS]
            # a partition's blocks start at its own offset 0 (the codec encodes each partition on its own)
            terms += block_variance(part, self._s, block, rows).to(self.device)
        self._row[g, 1:1 + self.levels] += terms
        sent = self._bucket_sent.get(b, -1)
        if sent >= 0:
            self._row[g, 1 + self.levels] += terms[sent]

    def bucket_done(self, bucket: "Bucket", flat: torch.Tensor, compressed: bool) -> None:
        """After the bucket's average was decoded: its energy ``‖Q̄‖²``."""
        g = self._group(bucket) if bucket.compressible else -1
        if g >= 0:
            f = flat.double()
            self._row[g, 0] += torch.dot(f, f)

    def end_step(self, finite: bool) -> None:
        """The step's measurement becomes what the next statistics vector carries (nothing if not finite); it
        stays on the device until then."""
        self._report, self._pending = self._empty(), None
        if finite:
            self._pending, self._pending_step = self._row.reshape(-1), self.step

    # ---- the exchange -----------------------------------------------------------------------------------
    def tail(self) -> torch.Tensor:
        """The last finite step's row, read from the device here (one transfer, right after the statistics
        read); a non-finite term sends nothing."""
        if self._pending is not None:
            row = self._pending.cpu()
            self._pending = None
            if all_finite(row):
                self._report = torch.cat([torch.tensor([float(self._pending_step)], dtype=F64), row])
        return self._report

    def agreed(self, tails: list[list[float]]) -> Optional[VarianceSample]:
        """Rank 0's ``‖Q̄_g‖²``; the rank-order sums of the variance terms over ``N²`` (nothing unless every rank
        reported the same step)."""
        step = int(tails[0][0])
        if step < 0 or any(int(row[0]) != step for row in tails):
            return None
        n2, width, out = float(self.world_size) ** 2, 2 + self.levels, []
        for g in range(self.spec.count):
            base = 1 + g * width
            sums = []
            for j in range(1, width):
                total = 0.0
                for row in tails:
                    total += row[base + j]
                sums.append(total / n2)
            variance, lost = sums[:-1], sums[-1]
            applied = tails[0][base]
            out.append(VarianceSignal(energy=max(0.0, applied - lost), applied=applied, variance=tuple(variance)))
        return VarianceSample(step=step, groups=tuple(out))

    # ---- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The measurement still to be sent (it belongs to the last step before the checkpoint)."""
        return {"report": self.tail().clone()}

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        self._pending = None
        ok = bool(state) and tuple(state["report"].shape) == (self.width,)
        self._report = state["report"].clone() if ok else self._empty()


__all__ = ["BLOCKS", "QuantVariance", "VarianceSample", "VarianceSignal", "VarianceSpec", "block_variance"]
