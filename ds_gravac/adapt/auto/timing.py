"""Predicted seconds of every level of every group, from the agreed cost-model fits (``sync/cost_model``).

A group is priced as if its members were fused into one bucket of their own (``ladder``'s grouping), sent with
the pattern its family uses, by the very formulas of ``sync/cost_model/predict.py`` where they exist:

* dense: ``stage + all_reduce(w·M) + writeback`` (``predict.dense_time``), ``w`` the bytes per value of the
  dense all-reduce (2: ``auto.dense_dtype`` bf16 or fp16; 4: an fp32 engine with ``"engine"``);
* QSGD at b bits: the bucket cut into N partitions of QSGD's real plans (``compress/qsgd.py``), sent by the
  all-gather at N = 2 and by CaSync-PS above (what ``quantized_exchange: "auto"`` does), ``predict.compressed_time``;
* sparsifier at CF θ: one Top-k plan per member (index + value), all-gathered, ``predict.compressed_time``;
* low rank r, priced here because ``predict`` refuses shape-dependent plans: PowerSGD's two rounds,
  ``all_reduce(4·Σ n·r) + all_reduce(4·Σ m·r)``, and a codec of ``Σ (3·n·m·r + (n + m)·r²)`` multiply-adds in
  ``5`` BLAS calls per matrix (the two projections and the decode's product, the two QRs), priced by a
  ``gemm`` fit ``A·calls + B·madds``, plus the stage, the error update ``E ← X − G`` and the write-back.

**Shared buckets** (``auto.buckets: "shared"``, low rank only): the groups travel in the engine's bucket plan,
so a group adds bytes to collectives that run anyway. Its rungs are priced by the fits' slopes ``B·bytes`` (the
latencies ``A`` are the plan's, whatever the codes), and its dense rung by the plain fp32 values it adds to the
bucket's first round. A step whose groups are all dense is a dense step in the dense dtype (:meth:`Pricer.dense_step`);
the knapsack prices it by the fp32 sum, from above.

Every collective is priced by the table's α–β fits ``A + B·bytes``. Those are measured at attach and refitted
online, so a slow link prices bytes higher and the same ladder compresses more. Codec fits missing from the
agreed table (it only calibrates the configured compressor) come from priors measured on the AMD EPYC core of
docs/BENCHMARKS_HISTORY.md §3.1; a codec fit is looked up per family, so QSGD's ``encode@4`` (8-bit) never prices
Top-k at CF 4.

**Overlap.** Predicted step = compute + Σ_groups exposed seconds, exposed = codec + stage/write-back +
``(1 − overlap)·`` wire time. The default ``overlap = 0`` hides nothing, as ``predict`` assumes: each rank has one
core, the codec runs on it, and gloo's threads take CPU from backward while they send (BENCHMARKS_HISTORY.md
§3.4: compute rises from 0.64 to 0.74–0.99 s once communication runs). The sum is what makes the plan a knapsack.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from ...compress.qsgd import QSGD as QSGDCompressor
from ...compress.qsgd import QSGDParams
from ...compress.topk import TopK, TopKParams
from ...sync.cost_model.fits import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, FitTable, LinearFit
from ...sync.cost_model.predict import compressed_time, dense_time
from .ladder import DENSE, LOWRANK, QSGD, SPARSE, Group, Level

if TYPE_CHECKING:
    from ...config import GravacConfig
    from ...compress.base import Compressor
    from ...sync.collectives import Channels

GEMM = "gemm"                    # seconds = A·calls + B·multiply-adds (fp32, one thread)
LOWRANK_CALLS = 5                # BLAS calls per matrix and step: P = X·Q, Q = Xᵀ·P, G = P·Qᵀ, two QRs

# Priors: one thread of the AMD EPYC core of docs/BENCHMARKS_HISTORY.md §3.1 (ResNet101's 42.5M values; seconds
# per element per call). Stage 25 ms, a copy 15 ms; QSGD encodes at 2.1 ns per value (0.4.1), its all-gather decode
# of two rows 41-61 ms; Top-k 119/67/52 ms at CF 10/100/1000 and a CF-100 decode of two rows 24 ms (a pass plus an
# index_add per kept value); GEMMs at 4-6 G multiply-adds per second at rank 16 (timed on a shared core of the
# same kind while other jobs ran: an unloaded core is faster, so this prior prices low rank high).
PRIOR_EDGES = {STAGE: LinearFit(0.0, 0.6e-9), WRITEBACK: LinearFit(0.0, 0.35e-9)}
PRIOR_CODEC: dict[str, dict[str, LinearFit]] = {
    QSGD: {**{f"encode@{cf:g}": LinearFit(0.0, 2.1e-9) for cf in (4.0, 8.0, 16.0)},
           "decode@4": LinearFit(0.0, 0.48e-9), "decode@8": LinearFit(0.0, 0.72e-9),
           "decode@16": LinearFit(0.0, 0.71e-9)},
    SPARSE: {"encode@4": LinearFit(0.0, 3.3e-9), "encode@10": LinearFit(0.0, 2.8e-9),
             "encode@30": LinearFit(0.0, 2.1e-9), "encode@100": LinearFit(0.0, 1.6e-9),
             "decode@4": LinearFit(0.0, 0.9e-9), "decode@10": LinearFit(0.0, 0.47e-9),
             "decode@30": LinearFit(0.0, 0.27e-9), "decode@100": LinearFit(0.0, 0.2e-9)},
    LOWRANK: {GEMM: LinearFit(20e-6, 2.0e-10)},
}


def link_fits(rate_bit_s: float, alpha_s: float, world_size: int) -> dict[str, LinearFit]:
    """α–β fits of gloo's ring collectives on a link of ``rate_bit_s`` (per rank and direction), in bytes of
    per-rank input: an all-reduce sends ``2(N−1)/N`` of its input, an all-gather ``N−1`` times it, an all-to-all
    ``(N−1)/N`` of it. The emulated cluster's all-reduce fits, recorded with its runs' results, are ``A`` 1–3 ms,
    ``B`` 8.2e-9 s/byte at 1 Gbit/s and 8.7e-8 s/byte at 100 Mbit/s: this line at N = 2."""
    if rate_bit_s <= 0 or alpha_s < 0 or world_size < 1:
        raise ValueError(f"ds_gravac: link rate {rate_bit_s} bit/s, alpha {alpha_s} s, {world_size} ranks")
    n, per_byte = world_size, 8.0 / rate_bit_s
    return {ALL_REDUCE: LinearFit(alpha_s, 2.0 * (n - 1) / n * per_byte),
            ALL_GATHER: LinearFit(alpha_s, (n - 1) * per_byte),
            ALL_TO_ALL: LinearFit(alpha_s, (n - 1) / n * per_byte)}


@dataclass(frozen=True)
class LevelCost:
    """One group at one level: bytes one rank sends (all rounds), seconds on its core, seconds on the wire."""

    payload_bytes: float
    codec_s: float
    wire_s: float
    edges_s: float

    def exposed(self, overlap: float) -> float:
        return self.codec_s + self.edges_s + (1.0 - overlap) * self.wire_s


class Pricer:
    """Prices levels from agreed fits: ``fits`` (collectives, stage, write-back: measured) over the priors, and
    per-family codec tables (``codec``: family → fits; missing ones from :data:`PRIOR_CODEC`)."""

    def __init__(self, fits: FitTable | Mapping[str, LinearFit], world_size: int,
                 codec: Optional[Mapping[str, Mapping[str, LinearFit]]] = None, overlap: float = 0.0,
                 qsgd_block: int = 128, topk_params: Optional[Mapping[str, object]] = None,
                 dense_bytes: int = 4, shared: bool = False) -> None:
        if not 0.0 <= overlap < 1.0:
            raise ValueError(f"ds_gravac: overlap must be in [0, 1) (got {overlap})")
        if dense_bytes not in (2, 4):
            raise ValueError(f"ds_gravac: a dense value is sent in 2 or 4 bytes (got {dense_bytes})")
        self.dense_bytes = int(dense_bytes)
        self.shared = bool(shared)
        base = fits.fits if isinstance(fits, FitTable) else dict(fits)
        self.world_size, self.overlap = int(world_size), float(overlap)
        # codec fits of the table belong to the configured compressor: they come in through ``codec`` only
        self.link = {**PRIOR_EDGES, **{k: v for k, v in base.items() if "@" not in k}}
        self.tables = {fam: FitTable({**self.link, **PRIOR_CODEC.get(fam, {}), **dict((codec or {}).get(fam, {}))})
                       for fam in (QSGD, SPARSE, LOWRANK)}
        self.dense_table = FitTable(self.link)
        self.qsgd = QSGDCompressor(QSGDParams(bucket_size=qsgd_block))
        self.topk = TopK(TopKParams(**dict(topk_params or {})))     # its value dtype sizes the payload

    @property
    def key(self) -> tuple:
        """Everything the prices depend on: two pricers with equal keys price every level alike."""
        return (self.world_size, self.overlap, self.dense_bytes, self.shared, self.qsgd.params.bucket_size,
                repr(self.topk.params),
                tuple((fam, tuple(sorted(t.fits.items()))) for fam, t in sorted(self.tables.items())))

    # ---- one level -------------------------------------------------------------------------------------
    def cost(self, group: Group, level: Level) -> LevelCost:
        m = group.numel
        edges = self.dense_table.get(STAGE)(m) + self.dense_table.get(WRITEBACK)(m)
        if level.family == DENSE and self.shared:          # plain fp32 values in a shared bucket's first round
            return LevelCost(4.0 * m, 0.0, self.dense_table.get(ALL_REDUCE).b * 4.0 * m, edges)
        if level.family == DENSE:
            total = dense_time(self.dense_table, m, self.dense_bytes)
            return LevelCost(float(self.dense_bytes * m), 0.0, total - edges, edges)
        if level.family == LOWRANK:
            return self._lowrank(group, int(level.value), edges)
        if level.family == QSGD:
            table, cf = self.tables[QSGD], 32.0 / level.value
            n = self.world_size
            plans = [self.qsgd.make_plan(-(-m // n), cf)] * n
            exchange = "allgather" if n == 2 else "casync_ps"
        elif level.family == SPARSE:
            table, cf = self.tables[SPARSE], level.value
            plans = [self.topk.make_plan(s, cf) for s in group.sizes]
            exchange = "allgather"
        else:
            raise ValueError(f"ds_gravac: cannot price {level}")
        total = compressed_time(table, exchange, m, self.world_size, plans)
        payload = 4.0 * sum(p.words for p in plans)
        wire = table.get(ALL_GATHER)(payload)
        if exchange == "casync_ps":
            wire = table.get(ALL_TO_ALL)(payload) + table.get(ALL_GATHER)(payload / self.world_size)
        sent = payload * (self.world_size - 1 if exchange == "allgather" else 2.0 * (self.world_size - 1)
                          / self.world_size)
        return LevelCost(sent, total - edges - wire, wire, edges)

    def _lowrank(self, group: Group, r: int, edges: float) -> LevelCost:
        """PowerSGD on every member (all of one shape ``n × m``): two all-reduces, one GEMM fit."""
        n, m = group.shape
        k = group.count
        table = self.tables[LOWRANK]
        reduce = table.get(ALL_REDUCE)
        if self.shared:                  # the bucket's two all-reduces run anyway: the group adds bytes only
            reduce = LinearFit(0.0, reduce.b)
        wire = reduce(4.0 * k * n * r) + reduce(4.0 * k * m * r)
        madds = k * (3.0 * n * m * r + (n + m) * r * r)
        codec = table.get(GEMM)(madds, calls=LOWRANK_CALLS * k) + table.get(STAGE)(group.numel)
        sent = 2.0 * (self.world_size - 1) / self.world_size * 4.0 * k * (n + m) * r
        return LevelCost(sent, codec, wire, edges)

    def dense_step(self, groups: Sequence[Group]) -> float:
        """Exposed seconds of a step whose groups are all dense: one all-reduce of every value in the dense dtype
        (what the synchronizer sends then, in either bucket layout)."""
        m = sum(g.numel for g in groups)
        edges = self.dense_table.get(STAGE)(m) + self.dense_table.get(WRITEBACK)(m)
        total = dense_time(self.dense_table, m, self.dense_bytes)
        return edges + (1.0 - self.overlap) * (total - edges)

    def plan_time(self, groups: Sequence[Group], times: Sequence[Sequence[float]], codes: Sequence[int]) -> float:
        """Predicted exchange seconds of a plan (``times``: this pricer's :meth:`times`): the sum of its rungs, or
        in shared buckets a dense step's own price when every group is dense (one all-reduce in the dense dtype,
        not each group's plain fp32 values)."""
        if self.shared and all(g.ladder[c].family == DENSE for g, c in zip(groups, codes)):
            return self.dense_step(groups)
        return predicted_step(0.0, times, codes)

    # ---- tables ----------------------------------------------------------------------------------------
    def times(self, groups: Sequence[Group]) -> list[list[float]]:
        """Exposed seconds of every rung of every group's ladder (the solver's cost table)."""
        return [[self.cost(g, lv).exposed(self.overlap) for lv in g.ladder] for g in groups]

    def payload(self, groups: Sequence[Group], codes: Sequence[int]) -> float:
        """Bytes one rank sends per step with these codes."""
        return sum(self.cost(g, g.ladder[c]).payload_bytes for g, c in zip(groups, codes))


def pricer_for(fits: Optional[FitTable], family: str, config: "GravacConfig", world: int, dense_bytes: int,
               shared: bool = False) -> Pricer:
    """The pricer of ``auto``'s plans: over agreed measured ``fits`` (a measured ``gemm`` line replaces the
    low-rank codec prior, a quantizer's or sparsifier's measured encode and decode its priors), else over the
    nominal link of ``auto.link_gbit_s``. The configured compressor's payload is priced as it is sent."""
    params = dict(config.compressor.params)
    shape = {"qsgd_block": int(params.get("bucket_size", 128)) if family == QSGD else 128,
             "topk_params": params if family == SPARSE else None, "dense_bytes": dense_bytes, "shared": shared}
    if not isinstance(fits, FitTable):
        a = config.auto
        return Pricer(link_fits(float(a.link_gbit_s) * 1e9, float(a.link_alpha_s), world), world, **shape)
    codec: dict[str, dict[str, LinearFit]] = {}
    if GEMM in fits.names():
        codec[LOWRANK] = {GEMM: fits.get(GEMM)}
    measured = {k: fits.get(k) for k in fits.names() if k.startswith(("encode@", "decode@"))}
    if family in (QSGD, SPARSE) and measured:
        codec[family] = measured
    return Pricer({k: fits.get(k) for k in fits.names() if k != GEMM}, world, codec=codec or None, **shape)


def predicted_step(compute_s: float, times: Sequence[Sequence[float]], codes: Sequence[int]) -> float:
    """Compute plus every group's exposed seconds at its code (summed in group order, as the solver does)."""
    total = 0.0
    for row, c in zip(times, codes):
        total += row[c]
    return compute_s + total


def calibrate_gemm(shapes: Sequence[tuple[int, int, int]] = ((256, 2304, 16), (512, 4608, 4), (64, 576, 8)),
                   repeats: int = 5) -> LinearFit:
    """Time ``Qᵀ·Xᵀ`` products of these ``(n, m, r)`` on this core and fit the ``gemm`` line (the local stand-in
    for the per-level encode calibration the cost model does for element-wise codecs)."""
    import torch

    from ...sync.cost_model.calibrate import median_time
    from ...sync.cost_model.fits import least_squares
    samples = []
    gen = torch.Generator().manual_seed(0)
    for n, m, r in shapes:
        x, q = torch.randn(n, m, generator=gen), torch.randn(r, m, generator=gen)
        samples.append((1.0, float(n * m * r), median_time(lambda: torch.mm(q, x.t()), repeats)))
    return least_squares(samples)


def measure_link(probe_bytes: Sequence[int], repeats: int, channels: "Channels",
                 ops: Sequence[str] = (ALL_REDUCE,), codec: Optional["Compressor"] = None,
                 levels: Sequence[float] = (), seed: int = 0) -> FitTable:
    """Every rank, at attach: time the collectives ``ops`` at ``probe_bytes`` on the first data channel, the
    ``gemm`` line on this core and, given a ``codec``, its encode and decode at every one of ``levels`` (with
    staging and write-back: the cost model's calibration, ``calibrate.codec_samples``), fit them, and agree on
    them (MAX of each coefficient over ranks, the cost model's rule), so that every rank prices the plan from the
    same pessimistic table, and a re-fit re-times the codec too."""
    from ...sync.cost_model.calibrate import CODEC_SIZES, agree, codec_samples, collective_samples
    from ...sync.cost_model.fits import least_squares
    samples = collective_samples(tuple(ops), probe_bytes, repeats, channels)
    if codec is not None:
        for level in levels:
            timed = codec_samples(codec, float(level), CODEC_SIZES, repeats, seed, channels.world_size,
                                  channels.rank)
            for name, rows in timed.items():
                samples.setdefault(name, []).extend(rows)
    local = FitTable({**{name: least_squares(rows) for name, rows in samples.items()},
                      GEMM: calibrate_gemm(repeats=repeats)})
    return agree(local, channels)


__all__ = ["GEMM", "LOWRANK_CALLS", "PRIOR_CODEC", "PRIOR_EDGES", "LevelCost", "Pricer", "calibrate_gemm",
           "link_fits", "measure_link", "predicted_step"]
