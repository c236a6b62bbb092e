"""The energy a sparsifier would leave unsent at each of its levels, per layer group, agreed (``mode: "auto"`` over
Top-k).

Why: each rank sends its own top-k of its compensated input ``x_w``, so the applied update is
``G = N⁻¹ Σ_w T_k(x_w)`` and what stays behind — for later, through error feedback — is the *pooled* residual
``N⁻¹ Σ_w (x_w − T_k(x_w))``. Its energy, not any rank's own residual (which also holds that rank's deviation from
the mean, cancelled by the average), is the error of the level (``adapt/auto/error_model.sparse_unsent``).

It needs every rank's values at the same coordinates, so it is sampled: every step ``SAMPLES`` coordinates are
drawn uniformly over the compressible elements from the shared seeded stream (every coordinate once when there
are fewer), and each rank reports, at each of them, ``x_w`` and for every level ``x_w·[|x_w| < τ_w(θ)]`` — what
that level leaves of it, ``τ_w(θ)`` being the k-th largest magnitude of the coordinate's tensor, ``k = k(θ, n)``
(exact for a tensor of at most ``THRESHOLD_SAMPLE`` values, else the matching quantile of a uniform sample of
that many of its magnitudes). The rank-order sums over ``N`` give the mean input and the pooled residuals at the
samples; ``n/K·Σ_{s∈g}`` of their squares estimates each group's ``‖x̄_g‖²`` and unsent energies without bias over
the coordinates (exact when every coordinate is taken and every tensor is small).

Levels are per tensor, so groups may share buckets; the dense rung still needs buckets of their own (a bucket is
sent dense as a whole), so ``UnsentSpec.bucketed``. Step i's measurement travels in step i + 1's statistics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from ..compress.base import k_for, stable_hash
from .host_values import all_finite, positions_within, shared_coordinates, to_list
from .streams import to_device

if TYPE_CHECKING:
    from .planner import Planner
    from .step_plan import StepPlan

SAMPLES = 2048               # shared coordinates per step
THRESHOLD_SAMPLE = 4096      # magnitudes a tensor's thresholds are taken from (all of a smaller tensor)
F64 = torch.float64


@dataclass(frozen=True)
class UnsentSpec:
    """A controller's groups over a sparsifier: member name → group, and the CFs measured (ladder order)."""

    members: dict[str, int]
    count: int
    cfs: tuple[float, ...]
    bucketed: bool = True


@dataclass(frozen=True)
class UnsentSignal:
    """One group's agreed terms of one step: ``‖x̄_g‖²`` and the pooled unsent energy at every CF of the spec."""

    energy: float
    unsent: tuple[float, ...]

    @property
    def per_level(self) -> tuple[float, ...]:
        return self.unsent


@dataclass(frozen=True)
class UnsentSample:
    step: int
    groups: tuple[UnsentSignal, ...]


def thresholds(x: torch.Tensor, cfs: tuple[float, ...], gen: torch.Generator) -> torch.Tensor:
    """Per CF the magnitude a value must reach to be among the tensor's top ``k(θ, n)`` (float64, on x's device:
    nothing is read on the host; ``gen`` a generator of that device). Values tied with it count as sent, so with
    many ties the unsent energy reads low."""
    mags = x.detach().reshape(-1).abs().to(F64)
    n = mags.numel()
    if n > THRESHOLD_SAMPLE:
        mags = mags[torch.randint(n, (THRESHOLD_SAMPLE,), generator=gen, device=mags.device)]
    ordered = torch.sort(mags, descending=True).values
    m = ordered.numel()
    ranks = [k_for(cf, n) if m == n else max(1, min(m, round(k_for(cf, n) * m / n))) for cf in cfs]
    return torch.stack([ordered[r - 1] for r in ranks])          # indexed by host ints: nothing is copied


class SparseUnsent:
    """Collects one step's sampled values and level residuals on this rank; turns the gathered vectors into agreed
    per-group signals. The same interface as ``AggregateGain`` where the synchronizer and the statistics use it."""

    def __init__(self, planner: "Planner", spec: UnsentSpec, seed: int, world_size: int,
                 samples: int = SAMPLES) -> None:
        self.planner, self.spec, self.seed, self.world_size = planner, spec, seed, world_size
        members = [m for m in planner.members if m.compressible]
        total = sum(m.numel for m in members)
        self.device = members[0].param.device if members else torch.device("cpu")
        self.samples = max(1, min(int(samples), total))
        self.levels = len(spec.cfs)
        self.width = 1 + self.samples * (1 + self.levels)
        self._report = self._empty()
        self._pending: Optional[tuple[torch.Tensor, int]] = None     # the last step's values, still on the device
        self._meta: dict[int, tuple[torch.Tensor, float]] = {}     # step → (group of each sample, scale)

    def _empty(self) -> torch.Tensor:
        out = torch.zeros(self.width, dtype=F64)
        out[0] = -1.0
        return out

    # ---- during the step ------------------------------------------------------------------------------
    def begin(self, step: int, plan: "StepPlan") -> None:
        """Draw this step's coordinates over the compressible buckets (the same on every rank)."""
        self.step = int(step)
        starts, start = {}, 0
        for b in self.planner.plan.buckets:
            if b.compressible:
                starts[b.index] = start
                start += b.numel
        self._total = start
        idx = shared_coordinates(self._total, self.samples, f"sparse-unsent:{self.seed}:{step}")
        self._count = int(idx.numel())
        self._where = {}
        self._groups = torch.full((self.samples,), -1, dtype=torch.int64)
        host: list[torch.Tensor] = []            # every index tensor of the step, moved to the device at once
        layout: dict[int, list[tuple[int, int, int]]] = {}      # bucket → (member, its slot pairs) / offsets slot
        for b, s in starts.items():
            bucket = self.planner.plan.buckets[b]
            pos = positions_within(idx, s, s + bucket.numel)
            if not pos.numel():
                continue
            off = idx[pos] - s
            member_starts = torch.tensor([m.offset for m in bucket.members], dtype=torch.int64)
            which = torch.searchsorted(member_starts, off, right=True) - 1
            ids = torch.tensor([self.spec.members.get(m.name, -1) for m in bucket.members], dtype=torch.int64)
            self._groups[pos] = ids[which]
            layout[b] = [(-1, len(host), -1)]
            host.append(off)
            for i, m in enumerate(bucket.members):
                inside = positions_within(off, m.offset, m.offset + m.numel)     # host: positions in ``off``
                if inside.numel():
                    layout[b].append((i, len(host), len(host) + 1))
                    host += [inside, pos[inside]]
        moved = to_device(host, self.device)
        self._where = {b: (moved[slots[0][1]], [(i, moved[a], moved[r]) for i, a, r in slots[1:]])
                       for b, slots in layout.items()}
        self._vals = torch.zeros(self.samples, 1 + self.levels, dtype=F64, device=self.device)

    def stage(self, b: int, flat_x: torch.Tensor) -> None:
        """The bucket's compensated input, before anything is sent: values and level residuals at the samples."""
        where = self._where.get(b)
        if where is None:
            return
        off, members = where
        bucket = self.planner.plan.buckets[b]
        gen = torch.Generator(device=flat_x.device)
        gen.manual_seed(stable_hash(f"sparse-thresholds:{self.seed}:{self.step}:{b}") & (2**62 - 1))
        values = flat_x[off].detach().to(F64)
        for i, inside, rows in members:
            m = bucket.members[i]
            taus = thresholds(flat_x[m.offset:m.offset + m.numel], self.spec.cfs, gen)
            v = values[inside]
            kept = v.abs().unsqueeze(1) < taus.unsqueeze(0)                      # samples × levels
            self._vals[rows] = torch.cat([v.unsqueeze(1), torch.where(kept, v.unsqueeze(1), 0.0)], dim=1)

    def bucket_done(self, bucket: Any, flat: torch.Tensor, compressed: bool) -> None:
        """Nothing: everything was taken from the input."""

    def end_step(self, finite: bool) -> None:
        """The step's samples become what the next statistics vector carries (nothing if not finite); they stay
        on the device until then."""
        self._report, self._pending = self._empty(), None
        if finite:
            self._pending = (self._vals.reshape(-1), self.step)
            self._meta = {self.step: (self._groups.clone(), self._total / max(1, self._count))}

    # ---- the exchange -----------------------------------------------------------------------------------
    def tail(self) -> torch.Tensor:
        """The last finite step's samples, read from the device here (one transfer, right after the statistics
        read); a non-finite value sends nothing."""
        if self._pending is not None:
            (vals, step), self._pending = self._pending, None
            row = vals.cpu()
            if all_finite(row):
                self._report = torch.cat([torch.tensor([float(step)], dtype=F64), row])
        return self._report

    def agreed(self, tails: list[list[float]]) -> Optional[UnsentSample]:
        """The rank-order means at every sample, squared and summed per group, scaled to the group's size (nothing
        unless every rank reported the same step)."""
        step = int(tails[0][0])
        meta = self._meta.get(step)
        if step < 0 or meta is None or any(int(row[0]) != step for row in tails):
            return None
        groups, scale = meta
        width = 1 + self.levels
        rows = torch.tensor(tails, dtype=F64)[:, 1:].reshape(len(tails), self.samples, width)
        mean = rows[0].clone()
        for row in rows[1:]:                   # rank order, element-wise: the same bits on every rank
            mean += row
        squares = to_list((mean / float(self.world_size)).square())
        sums = [[0.0] * width for _ in range(self.spec.count)]
        for g, sq in zip(to_list(groups), squares):
            if g >= 0:
                acc = sums[g]
                for j in range(width):
                    acc[j] += sq[j]
        return UnsentSample(step=step, groups=tuple(
            UnsentSignal(energy=scale * row[0], unsent=tuple(scale * v for v in row[1:])) for row in sums))

    # ---- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"report": self.tail().clone(),
                "meta": {k: (g.clone(), float(s)) for k, (g, s) in self._meta.items()}}

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        self._pending = None
        if not state or "meta" not in state or tuple(state["report"].shape) != (self.width,):
            self._report, self._meta = self._empty(), {}
            return
        self._report = state["report"].clone()
        self._meta = {int(k): (g.clone(), float(s)) for k, (g, s) in state["meta"].items()}


__all__ = ["SAMPLES", "THRESHOLD_SAMPLE", "SparseUnsent", "UnsentSample", "UnsentSignal", "UnsentSpec", "thresholds"]
