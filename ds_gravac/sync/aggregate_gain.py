"""GraVAC's gain measured on the averaged gradient (``"gain_denominator": "aggregate"``, low-rank compressors).

Why: the ``"ef"`` and ``"raw"`` gains are taken per rank, on the rank's own compensated input ``x_w``. For a
low-rank compressor with error feedback each rank's residual also holds its own deviation from the mean, which
never cancels locally: ``‖x_w‖²`` grows over the run while what the averaged factors apply does not, so the
per-rank gain drifts (towards 0 with the ``"ef"`` denominator, without bound with ``"raw"``) and says nothing about
how much of the *averaged* gradient a rank keeps. This gain is

    δ_agg(θ) = ‖G_θ‖² / ‖x̄‖²,    x̄ = mean over ranks of x_w,   G_θ = the aggregate applied at level θ,

the fraction of the mean input's energy that the update at θ carries (in [0, 1]).

Numerator, exact and free: the low-rank aggregate is ``G = Σ_k u_k·c_kᵀ`` with orthonormal ``u_k``, so
``‖G_r‖² = Σ_{k≤r} ‖c_k‖²`` for every rank ``r`` up to the one sent (prefixes of the reduced factor, which every
rank already holds); on a dense step the warm-start refresh projects the exact mean, which gives every rank up to
the factors' width. A level whose rank exceeds what the step computed gets no sample that step.

Denominator: ``G`` is an orthogonal projection of ``x̄``, so ``‖x̄‖² = ‖G‖² + ‖x̄ − G‖²``. ``‖G‖²`` is known exactly;
``‖x̄ − G‖²`` (what the step left behind, averaged over ranks) is estimated from ``SAMPLES`` coordinates drawn
uniformly from the shared seeded stream each step: each rank sends ``x_w − G`` at those coordinates, the sum over
ranks gives ``x̄ − G`` there, and ``n/k·Σ (x̄ − G)_s²`` is unbiased. Models with fewer compressible elements than
``SAMPLES`` use every coordinate (exact). A dense step's denominator is exact (``G = x̄``).

Per group (``mode: "auto"``, :class:`GroupSpec`): the same terms split by the groups a controller names — each
group's ``‖G_g‖²``, its prefix energies ``Σ_{k≤r} ‖c_k‖²`` at the ranks it asks for (−1 where the step did not
compute them: a rank above the one sent, or a matrix sent plain), and the sampled ``‖x̄_g − G_g‖²`` from the
coordinates that fall in the group (``n/k·Σ_{s∈g}``, unbiased for every group).

Everything of step ``i`` is known only after its aggregate is decoded, so it travels in step ``i + 1``'s
statistics vector (rank 0's values for the exact terms, rank-order sums for the samples) and the controller
receives it one step late, agreed like every other statistic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from ..compress.base import Compressor
from ..config import GravacConfig
from ..errors import GravacConfigError
from ..telemetry.stats import MAX_PROBES
from .host_values import all_finite, fill_where, positions_within, shared_coordinates, to_list
from .streams import to_device

if TYPE_CHECKING:
    from .buckets import Bucket, BucketPlan
    from .planner import Planner
    from .step_plan import StepPlan

SAMPLES = 4096
HEAD = 2 + MAX_PROBES            # step, ‖G‖², one numerator per probe slot (−1: not measured)


@dataclass(frozen=True)
class GroupSpec:
    """Tensors measured together (a controller's groups): member name → group index, and the ranks whose prefix
    energies every group reports."""

    members: dict[str, int]
    count: int
    ranks: tuple[int, ...]
    bucketed: bool = False          # low rank compresses per tensor: groups may share buckets

    @property
    def width(self) -> int:
        return self.count * (1 + len(self.ranks))


@dataclass(frozen=True)
class GroupSignal:
    """One group's agreed terms of one step: ``‖x̄_g‖²`` (``applied`` + the sampled remainder), ``‖G_g‖²``, and the
    prefix energies at the spec's ranks (None: not computed that step)."""

    den: float
    applied: float
    prefix: tuple[Optional[float], ...]


@dataclass(frozen=True)
class AggregateSample:
    """One step's agreed aggregate gain sample: the probe levels of that step and their numerators."""

    step: int
    levels: tuple[float, ...]
    den: float
    nums: tuple[Optional[float], ...]      # None: the level was not measurable at that step
    groups: tuple[GroupSignal, ...] = ()   # with a GroupSpec: per group


def check_aggregate_gain(config: GravacConfig, comp: Compressor) -> None:
    """``gain_denominator: "aggregate"`` needs a compressor that reports its aggregate's component energies."""
    if config.gravac.gain_denominator == "aggregate" and config.mode == "gravac" and not comp.aggregate_gain:
        raise GravacConfigError(
            f"ds_gravac: gain_denominator 'aggregate' is measured from the factors of a low-rank aggregate; "
            f"compressor '{config.compressor.type}' has none (key \"gain_denominator\": use \"ef\" or \"raw\", or a "
            f"low-rank compressor: powersgd, acpsgd)")


class AggregateGain:
    """Collects one step's aggregate gain on this rank and turns the gathered vectors into an agreed sample."""

    def __init__(self, comp: Compressor, planner: "Planner", seed: int, world_size: int,
                 samples: Optional[int] = None, groups: Optional[GroupSpec] = None) -> None:
        self.comp, self.planner, self.seed, self.world_size = comp, planner, seed, world_size
        members = [m for m in planner.members if m.compressible]
        compressible = sum(m.numel for m in members)
        self.device = members[0].param.device if members else torch.device("cpu")
        self.samples = max(1, min(int(samples if samples is not None else SAMPLES), compressible))
        self.spec = groups
        self.group_width = groups.width if groups is not None else 0
        self.width = HEAD + self.samples + self.group_width     # the tail this module adds to the statistics vector
        self._sample_groups = torch.full((self.samples,), -1, dtype=torch.int64)   # of the reported step
        self._plan: Optional["BucketPlan"] = None
        self._starts: dict[int, int] = {}
        self._total = 0
        self._report = self._empty()                # what the next statistics vector carries
        self._levels: dict[int, tuple[float, ...]] = {}   # step → its probe levels (agreed: from the plan)
        self._scale = 1.0
        self._pending: Optional[dict[str, Any]] = None   # the last finite step's values, still on the device

    def _empty(self) -> torch.Tensor:
        out = torch.zeros(self.width, dtype=torch.float64)
        out[0] = -1.0
        return out

    # ---- during the step ------------------------------------------------------------------------------
    def begin(self, step: int, step_plan: "StepPlan") -> None:
        """Draw this step's sample coordinates over the compressible buckets (the same on every rank)."""
        probes = step_plan.probes
        plan = self.planner.plan
        if plan is not self._plan:
            self._plan, start = plan, 0
            self._starts = {}
            for b in plan.buckets:
                if b.compressible:
                    self._starts[b.index] = start
                    start += b.numel
            self._total = start
        self.step, self.probes = int(step), tuple(float(p) for p in probes)
        idx = shared_coordinates(self._total, self.samples, f"aggregate-gain:{self.seed}:{step}")
        self._count = int(idx.numel())
        self._where: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for b, s in self._starts.items():
            pos = positions_within(idx, s, s + self._plan.buckets[b].numel)
            self._where[b] = (pos, idx[pos] - s)
        moved = iter(to_device([t for pair in self._where.values() for t in pair], self.device))
        self._where_dev = {b: (next(moved), next(moved)) for b in self._where}      # one transfer, no wait
        # device values, read once with the next step's statistics (no host read per bucket or member)
        self._x = torch.zeros(self.samples, dtype=torch.float64, device=self.device)
        self._applied = torch.zeros((), dtype=torch.float64, device=self.device)
        self._nums = torch.zeros(len(self.probes), dtype=torch.float64, device=self.device)
        self._valid = [True] * len(self.probes)
        if self.spec is not None:
            self._begin_groups()

    def _begin_groups(self) -> None:
        """Which group each sample coordinate belongs to, and this step's per-group accumulators."""
        spec = self.spec
        self._groups = torch.full((self.samples,), -1, dtype=torch.int64)
        for b, (pos, off) in self._where.items():
            members = self._plan.buckets[b].members
            starts = torch.tensor([m.offset for m in members], dtype=torch.int64)
            ids = torch.tensor([spec.members.get(m.name, -1) for m in members], dtype=torch.int64)
            if pos.numel():
                self._groups[pos] = ids[torch.searchsorted(starts, off, right=True) - 1]
        self._g_terms = torch.zeros(spec.count, 1 + len(spec.ranks), dtype=torch.float64, device=self.device)
        self._g_valid = [[True] * len(spec.ranks) for _ in range(spec.count)]

    def stage(self, b: int, flat_x: torch.Tensor) -> None:
        """The bucket's compensated input, before anything is sent: keep it at the sample coordinates."""
        pos, off = self._where_dev[b]
        if pos.numel():
            self._x[pos] = flat_x[off].double()

    def bucket_done(self, bucket: "Bucket", flat: torch.Tensor, compressed: bool) -> None:
        """After the bucket's aggregate was decoded and committed (component energies recorded)."""
        if not bucket.compressible:
            if flat.numel():
                f = flat.double()
                e = torch.dot(f, f).to(self.device)
                self._applied += e
                self._nums += e
            return
        pos, off = self._where_dev[bucket.index]
        if pos.numel():
            self._x[pos] -= flat[off].double()       # x_w − G at the sample coordinates
        ctxs = self.planner.ctxs[bucket.index]
        for m, ctx in zip(bucket.members, ctxs):
            seg = flat[m.offset:m.offset + m.numel].double()
            e = torch.dot(seg, seg).to(self.device)
            self._applied += e
            energies = self.comp.component_energies(ctx)
            cum = None if energies is None else torch.cat([torch.zeros(1, dtype=torch.float64, device=self.device),
                                                            torch.cumsum(energies, 0).double().to(self.device)])
            if self.spec is not None:
                self._group_member(m.name, e, cum)
            for j, p in enumerate(self.probes):
                rank = int(self.comp.tensor_plan(ctx.shape, self.comp.member_level(
                    ctx, self.planner.level(p, self.step))).get("rank") or 0)
                if rank == 0:                   # plain at this level: the exact mean, if that is what we hold
                    self._valid[j] = self._valid[j] and (not compressed or energies is None)
                    self._nums[j] += e
                elif cum is not None and rank < cum.numel():
                    self._nums[j] += cum[rank]
                else:
                    self._valid[j] = False

    def _group_member(self, name: str, energy: torch.Tensor, cum: Optional[torch.Tensor]) -> None:
        g = self.spec.members.get(name, -1)
        if g < 0:
            return
        self._g_terms[g, 0] += energy
        for j, r in enumerate(self.spec.ranks):
            if cum is not None and r < cum.numel():
                self._g_terms[g, 1 + j] += cum[r]
            else:
                self._g_valid[g][j] = False

    def end_step(self, finite: bool) -> None:
        """The step's measurement becomes what the next statistics vector carries (nothing if not finite); its
        values stay on the device until then."""
        self._report, self._pending = self._empty(), None
        if finite:
            values = [self._applied.reshape(1), self._nums[:MAX_PROBES], self._x[:self._count]]
            if self.spec is not None:
                values.append(self._g_terms.reshape(-1))
            self._pending = {"values": torch.cat(values), "step": self.step, "probes": self.probes,
                             "valid": list(self._valid), "count": self._count,
                             "scale": self._total / max(1, self._count),
                             "g_valid": [list(v) for v in self._g_valid] if self.spec is not None else None,
                             "groups": self._groups.clone() if self.spec is not None else None}

    def _materialize(self, p: dict[str, Any]) -> torch.Tensor:
        """The report of a finished step, from its device values read in one transfer: −1 where a level was not
        measured, empty if a sum is not finite; the samples' non-finite values count as 0."""
        out = self._empty()
        vals = p["values"].cpu()
        probes, count = len(p["probes"][:MAX_PROBES]), p["count"]
        head = vals[:1 + probes]
        if not all_finite(head):
            return out
        out[0], out[1] = float(p["step"]), head[0]
        for j, ok in enumerate(p["valid"][:probes]):
            out[2 + j] = head[1 + j] if ok else -1.0
        x = vals[1 + probes:1 + probes + count]
        out[HEAD:HEAD + count] = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
        self._levels = {p["step"]: p["probes"]}
        self._scale = p["scale"]
        if self.spec is not None:
            terms = vals[1 + probes + count:].view(self.spec.count, 1 + len(self.spec.ranks)).clone()
            fill_where(terms[:, 1:], ~torch.tensor(p["g_valid"], dtype=torch.bool), -1.0)
            if not all_finite(terms):
                return self._empty()
            out[HEAD + self.samples:] = terms.reshape(-1)
            self._sample_groups = p["groups"]
        return out

    # ---- the exchange -----------------------------------------------------------------------------------
    def tail(self) -> torch.Tensor:
        """The previous step's measurement, appended to this step's statistics vector (read from the device here,
        right after the statistics read)."""
        if self._pending is not None:
            self._report, self._pending = self._materialize(self._pending), None
        return self._report

    def agreed(self, tails: list[list[float]]) -> Optional[AggregateSample]:
        """From every rank's tail (rank order): rank 0's exact terms and the rank-order sums of the samples."""
        head = tails[0]
        step = int(head[0])
        levels = self._levels.get(step)
        if step < 0 or levels is None or any(int(row[0]) != step for row in tails):
            return None
        n = self.world_size
        squares = []                                  # (x̄ − G)² at every sample coordinate
        for s in range(HEAD, HEAD + self.samples):
            mean = 0.0
            for row in tails:
                mean += row[s]
            squares.append((mean / n) ** 2)
        left = 0.0
        for v in squares:
            left += v
        den = head[1] + self._scale * left
        nums = tuple(None if head[2 + j] < 0 else head[2 + j] for j in range(len(levels)))
        groups = () if self.spec is None else self._agreed_groups(head, squares)
        return AggregateSample(step=step, levels=levels, den=den, nums=nums, groups=groups)

    def _agreed_groups(self, head: list[float], squares: list[float]) -> tuple[GroupSignal, ...]:
        """Rank 0's exact per-group terms; each group's sampled remainder from its coordinates' squares."""
        spec = self.spec
        left = [0.0] * spec.count
        for v, g in zip(squares, to_list(self._sample_groups)):
            if g >= 0:
                left[g] += v
        terms, width, out = head[HEAD + self.samples:], 1 + len(spec.ranks), []
        for g in range(spec.count):
            row = terms[g * width:(g + 1) * width]
            out.append(GroupSignal(den=row[0] + self._scale * left[g], applied=row[0],
                                   prefix=tuple(None if v < 0 else v for v in row[1:])))
        return tuple(out)

    # ---- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The measurement still to be sent (it belongs to the last step before the checkpoint)."""
        return {"report": self.tail().clone(), "levels": dict(self._levels), "scale": self._scale,
                "sample_groups": self._sample_groups.clone()}

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        self._pending = None
        if not state or tuple(state["report"].shape) != (self.width,):
            self._report, self._levels = self._empty(), {}       # another sample count: start without one
            return
        self._report = state["report"].clone()
        self._levels = {int(k): tuple(v) for k, v in state["levels"].items()}
        self._scale = float(state["scale"])
        groups = state.get("sample_groups")
        if groups is not None and tuple(groups.shape) == tuple(self._sample_groups.shape):
            self._sample_groups = groups.clone()
