"""Compressor micro-benchmarks: CPU cost and extra memory of every compressor, on the synchronizer's own codec path.

For one gradient set (a model's real per-tensor shapes, synthetic or real gradients) and one compressor the
benchmark builds what the synchronizer of one rank builds — parameters (``torch.nn.Parameter`` with ``.grad`` set
to the gradients), the static classification and the bucket plan (``bucket_cap_mb`` MiB of fp32 per bucket), one
``CompressCtx`` per member, one ``BucketCodec`` per compressible bucket and the ``ErrorFeedbackMemory`` — with the
synchronizer's own ``Planner`` (so contexts come from the same ``_make_ctx``: SGD lr 0.1, momentum 0.9, weight
decay 1e-4, as in the ResNet/VGG configs). Each timed step then runs, per compressible bucket in plan order, what
``Synchronizer._launch_compressible`` / ``_send_compressible`` and ``completion.complete_step`` run for a compressed bucket, with
those objects and nothing copied:

    t_stage       release_gradients, step number into the contexts, memory.stage (x = g + r, or the compressor's
                  ``compensate``, into the bucket's scratch), ctx.residual = x
    t_norm        Σ dot(x, x) per member (the gain denominator and the non-finite check of every step)
    t_compress    codec.encode at the sent level into the cached send layout (no probes)
    t_residual    codec.leave_memory (scratch → the memory left after sending) + memory.commit_compressed (slot
                  swap; DGC: momentum update) + codec.commit_aggregate (low-rank: PowerSGD's E = X − G, the
                  shared factors), also reported split as t_leave_memory / t_commit_memory / t_aggregate
    t_round2      two-round patterns (PowerSGD): codec.next_round, the work between the rounds (orthogonalize
                  the reduced P, project Xᵀ on it); rank 0's own P stands in for the reduced one
    t_decompress_n{2,4}
                  exchange.result(scratch, 1/N) of the compressor's exchange pattern (PayloadAllGather:
                  decode_rows of N rows; PayloadAllReduce: decode_sum of the summed payload, N-independent)

Nothing is communicated. The N rows are real payloads of N different seeded gradient sets (seed, seed+1, ...),
each encoded by its own rank's planner/codec/memory (own compressor instance, ``ctx.rank`` = its rank): row 0 is
rank 0's payload of its last timed step, rows 1.. are the other ranks' first-step payloads at the same step number
(so Random-k's shared indices agree). The exchange object is constructed exactly as a step does (which allocates
its receive buffer) on a codec of its own per N — a layout's receive buffer is sized once, for one world size — and
its received data is filled with what the collective would leave there. ``p.grad`` is not rewritten after the
decode (``write_grads`` makes fp32 contiguous gradients views of the scratch, no copy), so every step sees the
same fresh gradients with the memory it accumulated. Every level starts from an empty memory.

``passes = t / t_pass``: ``t_pass`` is the median time of ``x.abs()`` over all tensors of the set, re-measured
next to every row (``passes_out``: against ``torch.abs(x, out=buf)`` into preallocated buffers, the stricter bound;
fresh outputs pay page faults). Reference lines: naive Top-k (``torch.topk(|x|, k)`` + gather), a 1%-sampled
threshold estimate, and multi-level vs direct through ``codec.encode`` with probes (θ_min compressed, higher
levels derived with ``compress_from``, each probe's ‖C(x)‖² included, as in a GraVAC step) against one direct probe
encode per level.

Extra memory per rank (``memory`` rows): see ``micro_memory``. Quantizers and half casts get rows per N of their
own: see ``micro_quantizers``.

Modules: ``micro_settings`` (fixed settings), ``micro_timing`` (medians, bytes), ``micro_grads`` (gradient sets),
``micro_rank`` (one rank's production objects), ``micro_rows`` (timed rows and reference lines), ``micro_memory``,
``micro_report`` (environment, tables); this module drives them and holds the command line.

    OMP_NUM_THREADS=1 python -m ds_gravac_bench.micro --sets resnet101 --compressors topk --out r.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ds_gravac.compress.base import Compressor
from ds_gravac.compress.registry import lookup, registered_names
from ds_gravac.config import GravacConfig

from . import micro_quantizers as mq
from .micro_grads import GradSet, measure_compute, real_grads, set_shapes, synthetic_grads
from .micro_memory import memory_rows
from .micro_rank import Rank, fresh_compressor
from .micro_report import environment, print_table
from .micro_rows import multilevel, naive_topk, run_level, sampled_threshold
from .micro_settings import (COMPUTE_REF_S, DECODE_NS, LOWRANK_RANKS, MEMORY_NS, OPTIMIZER, SEARCH_PROBES,
    SEARCH_SEND, SETS, SMOKE_BUCKET_CAP_MB, SMOKE_SHAPES, TARGET_EXTRA_X, TOPK_ALGORITHMS)

__all__ = ["main", "parse_args", "SMOKE_SHAPES"]     # SMOKE_SHAPES: the tests size the smoke set from it


def compressor_variants(names: list[str], algorithms: Sequence[str], ranks: Sequence[int] = LOWRANK_RANKS
                        ) -> list[tuple[str, str, Compressor]]:
    """(label, registered name, instance); Top-k once per selection algorithm; ACP-SGD once per phase (its P-
    and Q-steps move different factors)."""
    out = []
    for name in names:
        cls = lookup(name)
        if name == "topk":
            out += [(f"topk[{a}]", name, cls(cls.Params(algorithm=a))) for a in algorithms]
        elif cls.level_kind == "rank":
            for phase in ((0, 1) if name == "acpsgd" else (0,)):
                comp = cls()
                comp.bind_levels("rank", float(max(ranks)))
                comp.phase = phase
                out.append((f"{name}[{'PQ'[phase]}]" if name == "acpsgd" else name, name, comp))
        else:
            out.append((name, name, cls()))
    return out


def levels_for(comp: Compressor, cfs: list[float], ranks: Sequence[int] = LOWRANK_RANKS) -> list[float]:
    """CF-continuous: the requested CFs; grids: the realizable values they snap to; low-rank: the ranks."""
    if comp.level_kind == "rank":
        return [float(r) for r in ranks]
    if comp.cf_grid() is None:
        return list(cfs)
    return sorted({comp.realize_cf(c) for c in cfs})


def bench_compressor(gs: GradSet, set_name: str, label: str, name: str, comp: Compressor, cfg: GravacConfig,
                     args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Rows of one compressor on one set into ``report`` (results, multilevel, memory); errors are recorded."""
    levels = levels_for(comp, args.cfs, args.ranks)
    if mq.handles(comp):      # quantizers (bucket partitions) and half casts: rows per N of their own
        return mq.bench(gs, set_name, label, name, comp, cfg, args, report)
    ranks = len(gs.rank_grads)
    own = Rank(gs, comp, 0, ranks, cfg)
    if not own.compressible:
        for level in levels:
            report["results"].append({"set": set_name, "compressor": label, "name": name, "level": level,
                                      "skipped": "accepts no tensor (sent dense)"})
        return
    others = [Rank(gs, fresh_compressor(comp), r, ranks, cfg) for r in range(1, ranks)]
    direct: dict[float, float] = {}
    for level in levels:
        try:
            res = run_level(gs, own, others, level)
        except Exception as exc:  # a compressor this generic driver cannot run: record, continue
            res = {"level": level, "error": f"{type(exc).__name__}: {exc}"}
        report["results"].append({"set": set_name, "compressor": label, "name": name, **res})
        if "t_compress" in res:
            direct[level] = res["t_compress"]["median"]
    del others
    ml_levels = [lv for lv in (10.0, 100.0, 1000.0) if lv in direct]
    if comp.multilevel != "none" and len(ml_levels) > 1 and "error" not in report["results"][-1]:
        report["multilevel"].append({"set": set_name, "compressor": label,
                                     **multilevel(gs, own, ml_levels, direct)})
    try:
        rows = memory_rows(gs, own, levels)
    except Exception as exc:
        rows = [{"error": f"{type(exc).__name__}: {exc}"}]
    report["memory"] += [{"set": set_name, "compressor": label, "name": name, **r} for r in rows]


def bench_set(set_name: str, args: argparse.Namespace, variants: list[tuple[str, str, Compressor]],
              report: dict[str, Any]) -> None:
    """Every row of one gradient set: set info, reference lines, then each compressor variant."""
    shapes = set_shapes(set_name, args.smoke)
    ranks = max(*DECODE_NS, *args.world_sizes)
    if args.source == "real" and not args.smoke:
        rank_grads = [real_grads(set_name, args.seed + r) for r in range(ranks)]
    else:
        rank_grads = [synthetic_grads(shapes, args.seed + r) for r in range(ranks)]
    gs = GradSet([n for n, _ in shapes], [s for _, s in shapes], rank_grads, args.repeats)
    cfg = GravacConfig(bucket_cap_mb=args.bucket_cap_mb, min_compress_numel=args.min_compress_numel, seed=args.seed)
    info = {"numel": gs.numel, "tensors": len(gs.grads), "grad_bytes": gs.grad_bytes, "t_pass": gs.t_pass,
            "t_pass_out": gs.t_pass_out, "compute_ref_s": COMPUTE_REF_S[set_name]}
    if args.measure_compute and not args.smoke:
        info["t_compute"] = measure_compute(set_name, args.repeats)
    report["sets"][set_name] = info
    for level in args.cfs:
        report["naive_topk"].append({"set": set_name, **naive_topk(gs, level)})
        report["sampled_threshold"].append({"set": set_name, **sampled_threshold(gs, level)})
    for label, name, comp in variants:
        bench_compressor(gs, set_name, label, name, comp, cfg, args, report)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The command line, with comma lists parsed and the smoke defaults applied."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS), help="comma list of resnet101, vgg16, lstm")
    ap.add_argument("--compressors", default="", help="comma list (default: every registered one)")
    ap.add_argument("--topk-algorithms", default=",".join(TOPK_ALGORITHMS))
    ap.add_argument("--cfs", default="10,100,1000", help="CFs for CF-continuous compressors")
    ap.add_argument("--ranks", default=",".join(map(str, LOWRANK_RANKS)), help="ranks for low-rank compressors")
    ap.add_argument("--world-sizes", default=",".join(map(str, DECODE_NS)), help="simulated N for quantizers")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--source", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=float, default=None,
                    help=f"bucket cap of the plan (default: the config's 25; {SMOKE_BUCKET_CAP_MB} with --smoke)")
    ap.add_argument("--min-compress-numel", type=int, default=0, help="tensors below it are dense-classified")
    ap.add_argument("--measure-compute", action="store_true", help="also time each model's forward+backward")
    ap.add_argument("--smoke", action="store_true", help="10^5-element sets, 1 repeat")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    unknown = set(args.sets) - set(SETS)
    if unknown:
        ap.error(f"unknown set(s): {', '.join(sorted(unknown))}")
    args.cfs = [float(c) for c in args.cfs.split(",") if c]
    args.ranks, args.world_sizes = ([int(r) for r in v.split(",") if r] for v in (args.ranks, args.world_sizes))
    args.compressors = [c for c in args.compressors.split(",") if c] or registered_names()
    args.topk_algorithms = [a for a in args.topk_algorithms.split(",") if a]
    if args.smoke:
        args.repeats = 1
    if args.bucket_cap_mb is None:
        args.bucket_cap_mb = SMOKE_BUCKET_CAP_MB if args.smoke else float(GravacConfig().bucket_cap_mb)
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the benchmark, print the tables, write ``--out``; the report, for in-process callers (tests)."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    variants = compressor_variants(args.compressors, args.topk_algorithms, args.ranks)
    report: dict[str, Any] = {
        "env": environment(),
        "config": {"sets": args.sets, "compressors": [v[0] for v in variants], "cfs": args.cfs,
                   "repeats": args.repeats, "smoke": args.smoke, "source": args.source, "seed": args.seed,
                   "path": "production codec (Planner, BucketCodec, ErrorFeedbackMemory, exchange patterns)",
                   "bucket_cap_mb": args.bucket_cap_mb, "min_compress_numel": args.min_compress_numel,
                   "optimizer": OPTIMIZER, "decode_ns": list(DECODE_NS),
                   "decode_rows": "N different seeded gradient sets (seed + rank), each encoded by its own rank's "
                                  "planner/codec/memory; row 0 = rank 0's payload of its last timed step",
                   "memory_ns": list(MEMORY_NS), "search": {"send": SEARCH_SEND, "probes": list(SEARCH_PROBES)},
                   "memory_target_x": TARGET_EXTRA_X},
        "sets": {}, "results": [], "naive_topk": [], "sampled_threshold": [], "multilevel": [], "memory": []}
    for set_name in args.sets:
        bench_set(set_name, args, variants, report)
    print_table(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
