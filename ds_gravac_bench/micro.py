"""Compressor micro-benchmarks: CPU cost of every compressor against one memory pass.

Per gradient set (real per-tensor shapes) and compressor level it times, per tensor as the synchronizer
calls them: staging (fused EF add, or ``compensate`` for compressors with their own memory), ``compress``,
``decompress`` of N = 2 and N = 4 payloads, the residual update (``commit``), and reports payload bytes,
input GB/s and ``passes = t / t_pass`` (``t_pass`` = median time of ``x.abs()`` over the same tensors; also
``passes_out`` against ``torch.abs(x, out=buf)`` into preallocated buffers, the stricter bound: fresh outputs
pay page faults, which made ``x.abs()`` 2.5x slower than the pure memory pass on the reference box).
Reference lines: naive Top-k (``torch.topk(|x|, k)`` + gather), a 1%-sampled threshold estimate, and
multi-level compression (10x, then 100x and 1000x derived with ``compress_from``) against direct ones.

    OMP_NUM_THREADS=1 python -m ds_gravac_bench.micro --sets resnet101 --compressors topk --out r.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from ds_gravac.compress.base import CompressCtx, Compressor, Kind, Payload, k_for
from ds_gravac.compress.registry import lookup, registered_names

ROOT = Path(__file__).resolve().parents[1]

SETS = ("resnet101", "vgg16", "lstm")
MODEL_ARGS = {"resnet101": ("resnet101", {"num_classes": 10}), "vgg16": ("vgg16", {"num_classes": 100}),
              "lstm": ("lstm", {"vocab_size": 10000, "size": "large"})}
COMPUTE_REF_S = {"resnet101": 1.3, "vgg16": 2.1, "lstm": None}   # reference fwd+bwd s, batch 32, one core
TOPK_ALGORITHMS = ("auto", "topk", "kthvalue", "sort")
SMOKE_SHAPES = [(250, 240), (20000,), (64, 3, 7, 7), (1000,), (9592,)]   # 10^5 elements


# ---- statistics and timing ------------------------------------------------------------------------------
def stats(samples: Sequence[float]) -> dict[str, float]:
    """Median and 10th/90th percentiles (linear interpolation), seconds."""
    xs = sorted(samples)

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"median": q(0.5), "p10": q(0.1), "p90": q(0.9), "n": len(xs)}


def timed(fn: Callable[[int], Any], repeats: int, prepare: Optional[Callable[[int], Any]] = None
          ) -> dict[str, float]:
    """Run ``fn(i)`` once as warm-up and ``repeats`` times; ``prepare(i)`` runs untimed before each call."""
    samples = []
    for i in range(repeats + 1):
        if prepare is not None:
            prepare(i)
        t0 = time.perf_counter()
        fn(i)
        dt = time.perf_counter() - t0
        if i > 0:
            samples.append(dt)
    return stats(samples)


# ---- gradient sets ------------------------------------------------------------------------------------
def set_shapes(name: str, smoke: bool) -> list[tuple[str, tuple[int, ...]]]:
    """Named parameter shapes of the set's model, built on the meta device (no memory, no download)."""
    if smoke:
        return [(f"{name}.t{i}", s) for i, s in enumerate(SMOKE_SHAPES)]
    from runners.models import build_model
    model_name, kw = MODEL_ARGS[name]
    with torch.device("meta"):
        model = build_model(model_name, **kw)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def laplace_like(numel: int, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Laplace(0, scale) by inversion; |2u-1| is clamped below 1 so fp32 never yields an infinite sample."""
    s = torch.rand(numel, generator=gen).sub_(0.5)
    mag = s.abs().mul_(2.0).clamp_(max=1.0 - 2.0 ** -24).neg_().log1p_().neg_()
    return torch.copysign(mag, s).mul_(scale)


def synthetic_grads(shapes: list[tuple[str, tuple[int, ...]]], seed: int) -> list[torch.Tensor]:
    """Seeded Laplace noise, one scale per tensor (10^-4 … 10^-1, log-uniform), flat fp32."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.empty(len(shapes)).uniform_(-4.0, -1.0, generator=gen)
    return [laplace_like(math.prod(s), float(10 ** sc), gen) for (_, s), sc in zip(shapes, scales)]


def real_grads(name: str, seed: int) -> list[torch.Tensor]:
    """Gradients of one forward/backward on synthetic inputs (batch 8 images, or 35x20 tokens)."""
    from runners.models import build_model
    torch.manual_seed(seed)
    model_name, kw = MODEL_ARGS[name]
    model = build_model(model_name, **kw)
    if name == "lstm":
        tokens = torch.randint(0, 10000, (36, 20))
        out, _ = model(tokens[:-1], model.init_hidden(20))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, 10000), tokens[1:].reshape(-1))
    else:
        images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, kw["num_classes"], (8,))
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    return [p.grad.detach().reshape(-1).clone() for p in model.parameters()]


def measure_compute(name: str, repeats: int) -> dict[str, float]:
    """Forward+backward time of the set's model at batch 32 (LSTM: 35 x 20 tokens)."""
    from runners.models import build_model
    model_name, kw = MODEL_ARGS[name]
    model = build_model(model_name, **kw)
    if name == "lstm":
        tokens = torch.randint(0, 10000, (36, 20))

        def step(_: int) -> None:
            out, _h = model(tokens[:-1], model.init_hidden(20))
            torch.nn.functional.cross_entropy(out.reshape(-1, 10000), tokens[1:].reshape(-1)).backward()
    else:
        images, labels = torch.randn(32, 3, 32, 32), torch.randint(0, kw["num_classes"], (32,))

        def step(_: int) -> None:
            torch.nn.functional.cross_entropy(model(images), labels).backward()
    return timed(step, max(1, min(repeats, 3)))


# ---- one compressor at one level ------------------------------------------------------------------------
class Bench:
    """Buffers and contexts of one gradient set; each compressor runs per tensor, as in the synchronizer."""

    def __init__(self, names: list[str], shapes: list[tuple[int, ...]], grads: list[torch.Tensor], repeats: int):
        self.names, self.shapes, self.grads, self.repeats = names, shapes, grads, repeats
        self.x = [torch.empty_like(g) for g in grads]
        self.r = [torch.zeros_like(g) for g in grads]
        self.numel = sum(g.numel() for g in grads)
        self.scratch = [torch.empty_like(g) for g in grads]
        self.t_pass, self.t_pass_out = self.pass_now()
        for g, x in zip(grads, self.x):
            x.copy_(g)

    def pass_now(self) -> tuple[dict[str, float], dict[str, float]]:
        """(fresh-output, preallocated-output) pass times, re-measured next to each measurement so load
        drift on a shared core cancels in the ratios."""
        fresh = timed(lambda _: [g.abs() for g in self.grads], self.repeats)
        out = timed(lambda _: [torch.abs(g, out=o) for g, o in zip(self.grads, self.scratch)], self.repeats)
        return fresh, out

    def passes(self, s: dict[str, float], ref: Optional[dict[str, float]] = None) -> float:
        return s["median"] / (ref or self.t_pass)["median"]

    def ctxs(self, step: int, residuals: Optional[list[torch.Tensor]] = None) -> list[CompressCtx]:
        return [CompressCtx(key=n, step=step, shape=s, residual=None if residuals is None else residuals[i])
                for i, (n, s) in enumerate(zip(self.names, self.shapes))]

    def run(self, comp: Compressor, level: float) -> dict[str, Any]:
        idx = [i for i, s in enumerate(self.shapes) if comp.accepts(s)]
        if not idx:
            return {"level": level, "skipped": "accepts no tensor (sent dense)"}
        dtype = torch.float32 if comp.kind == Kind.SUMMABLE else torch.int32
        level = comp.effective_cf(level, 10 ** 9)
        pay = {i: Payload.allocate(comp.plan(self.grads[i].numel(), level), dtype) for i in idx}
        fresh, out = self.pass_now()
        res: dict[str, Any] = {"level": level, "tensors": len(idx), "t_pass_local": fresh, "t_pass_out_local": out}
        res["t_stage"] = timed(lambda step: self._stage(comp, idx, step), self.repeats)
        counts: list[int] = []
        res["t_compress"] = timed(lambda step: self._compress(comp, idx, pay, step, counts), self.repeats)
        for n_ranks in (2, 4):
            res[f"t_decompress_n{n_ranks}"] = timed(lambda step: self._decompress(comp, idx, pay, n_ranks, step),
                                                   self.repeats)
        res["t_residual"] = self._residual(comp, idx, pay)
        plans = [pay[i].plan for i in idx]
        compressed = sum(self.grads[i].numel() for i in idx)
        res["payload_bytes"] = sum(comp.wire_bytes(p) for p in plans)
        res["values_sent"] = sum(comp.values_sent(p) for p in plans)
        res["real_entries"] = sum(counts[-len(idx):]) if counts else None
        res["compressed_numel"] = compressed
        res["wire_cf"] = 4 * compressed / max(1, res["payload_bytes"])
        res["gbps_compress"] = 4 * compressed / res["t_compress"]["median"] / 1e9
        keys = ("t_stage", "t_compress", "t_decompress_n2", "t_decompress_n4", "t_residual")
        res["passes"] = {k: self.passes(res[k], res["t_pass_local"]) for k in keys}
        res["passes_out"] = {k: self.passes(res[k], res["t_pass_out_local"]) for k in keys}
        res["passes_vs_set_t_pass"] = {k: self.passes(res[k]) for k in keys}
        return res

    def _stage(self, comp: Compressor, idx: list[int], step: int) -> None:
        ctxs = self.ctxs(step)
        for i in idx:
            if comp.owns_state:
                self.x[i].copy_(comp.compensate(self.grads[i], ctxs[i]))
            else:
                torch.add(self.grads[i], self.r[i], out=self.x[i])

    def _compress(self, comp: Compressor, idx: list[int], pay: dict[int, Payload], step: int,
                  counts: list[int]) -> None:
        ctxs = self.ctxs(step)
        for i in idx:
            m = comp.compress(self.x[i], pay[i].plan, pay[i], ctxs[i], update_state=False)
            counts.append(int(m) if m is not None else pay[i].plan.k)

    def _decompress(self, comp: Compressor, idx: list[int], pay: dict[int, Payload], n_ranks: int,
                    step: int) -> None:
        ctxs = self.ctxs(self.repeats)   # the step of the last compress: Random-k decodes from its cache
        rounds = 1 if comp.kind == Kind.SUMMABLE else n_ranks   # summable payloads are decoded once
        for i in idx:
            out = self.r[i]
            out.zero_()
            for _ in range(rounds):
                comp.decompress(pay[i], out, accumulate=True, scale=1.0 / n_ranks, ctx=ctxs[i])
        for i in idx:
            self.r[i].zero_()

    def _residual(self, comp: Compressor, idx: list[int], pay: dict[int, Payload]) -> dict[str, float]:
        """``commit`` into a copy of x (the synchronizer's aliased residual: x becomes r in place)."""
        copies = {i: torch.empty_like(self.x[i]) for i in idx}

        def prepare(_: int) -> None:
            for i in idx:
                copies[i].copy_(self.x[i])

        def commit(_: int) -> None:
            ctxs = self.ctxs(self.repeats, [copies.get(i, self.r[i]) for i in range(len(self.grads))])
            for i in idx:
                comp.commit(copies[i], pay[i], ctxs[i])

        return timed(commit, self.repeats, prepare)


# ---- reference lines and multi-level ------------------------------------------------------------------
def naive_topk(b: Bench, level: float) -> dict[str, Any]:
    def run(_: int) -> None:
        for x in b.x:
            idx = torch.topk(x.abs(), k_for(level, x.numel()), sorted=False).indices
            x.index_select(0, idx)
    ref, ref_out = b.pass_now()
    t = timed(run, b.repeats)
    return {"level": level, "t": t, "t_pass_local": ref, "t_pass_out_local": ref_out, "passes": b.passes(t, ref),
            "passes_out": b.passes(t, ref_out)}


def sampled_threshold(b: Bench, level: float, ratio: float = 0.01) -> dict[str, Any]:
    def run(step: int) -> None:
        gen = torch.Generator().manual_seed(step)
        for x in b.x:
            s = max(1, math.ceil(ratio * x.numel()))
            sample = x.index_select(0, torch.randint(x.numel(), (s,), generator=gen)).abs_()
            torch.topk(sample, max(1, math.ceil(s / level)), sorted=False).values.min()
    ref, ref_out = b.pass_now()
    t = timed(run, b.repeats)
    return {"level": level, "sample_ratio": ratio, "t": t, "t_pass_local": ref, "t_pass_out_local": ref_out,
            "passes": b.passes(t, ref), "passes_out": b.passes(t, ref_out)}


def multilevel(b: Bench, comp: Compressor, levels: list[float], direct: dict[float, float]) -> dict[str, Any]:
    """Compress at levels[0], derive the others with ``compress_from`` in order (as the synchronizer does)."""
    idx = [i for i, s in enumerate(b.shapes) if comp.accepts(s)]
    dtype = torch.float32 if comp.kind == Kind.SUMMABLE else torch.int32
    pays = {lv: {i: Payload.allocate(comp.plan(b.grads[i].numel(), lv), dtype) for i in idx} for lv in levels}
    stage: dict[float, list[float]] = {lv: [] for lv in levels}
    for step in range(b.repeats + 1):
        ctxs = b.ctxs(step)
        for j, lv in enumerate(levels):
            t0 = time.perf_counter()
            for i in idx:
                if j == 0:
                    comp.compress(b.x[i], pays[lv][i].plan, pays[lv][i], ctxs[i], update_state=False)
                else:
                    prev = pays[levels[j - 1]][i]
                    comp.compress_from(prev, b.x[i], pays[lv][i].plan, pays[lv][i], ctxs[i])
            if step > 0:
                stage[lv].append(time.perf_counter() - t0)
    t_stage = {str(lv): stats(v) for lv, v in stage.items()}
    multi = sum(t_stage[str(lv)]["median"] for lv in levels)
    direct_total = sum(direct[lv] for lv in levels)
    pairs = {f"{levels[0]:g}+{lv:g}": {"direct": direct[levels[0]] + direct[lv],
                                       "multi": t_stage[str(levels[0])]["median"] + t_stage[str(lv)]["median"]}
             for lv in levels[1:]}
    for p in pairs.values():
        p["ratio"] = p["multi"] / p["direct"]
    return {"levels": levels, "t_stage": t_stage, "t_multi": multi, "t_direct": direct_total,
            "ratio": multi / direct_total, "pairs": pairs}


# ---- driver ---------------------------------------------------------------------------------------------
def compressor_variants(names: list[str], algorithms: Sequence[str]) -> list[tuple[str, str, Compressor]]:
    """(label, registered name, instance); Top-k once per selection algorithm."""
    out = []
    for name in names:
        cls = lookup(name)
        if name == "topk":
            out += [(f"topk[{a}]", name, cls(cls.Params(algorithm=a))) for a in algorithms]
        else:
            out.append((name, name, cls()))
    return out


def levels_for(comp: Compressor, cfs: list[float]) -> list[float]:
    """CF-continuous: the requested CFs; grids: the realizable values they snap to; low-rank: rank 4."""
    if comp.level_kind == "rank":
        return [4.0]
    if comp.cf_grid() is None:
        return list(cfs)
    return sorted({comp.realize_cf(c) for c in cfs})


def bench_set(set_name: str, args: argparse.Namespace, variants: list[tuple[str, str, Compressor]],
              report: dict[str, Any]) -> None:
    shapes = set_shapes(set_name, args.smoke)
    grads = real_grads(set_name, args.seed) if args.source == "real" and not args.smoke else \
        synthetic_grads(shapes, args.seed)
    b = Bench([n for n, _ in shapes], [s for _, s in shapes], grads, args.repeats)
    info = {"numel": b.numel, "tensors": len(grads), "t_pass": b.t_pass, "t_pass_out": b.t_pass_out,
            "compute_ref_s": COMPUTE_REF_S[set_name]}
    if args.measure_compute and not args.smoke:
        info["t_compute"] = measure_compute(set_name, args.repeats)
    report["sets"][set_name] = info
    for level in args.cfs:
        report["naive_topk"].append({"set": set_name, **naive_topk(b, level)})
        report["sampled_threshold"].append({"set": set_name, **sampled_threshold(b, level)})
    for label, name, comp in variants:
        direct: dict[float, float] = {}
        for level in levels_for(comp, args.cfs):
            try:
                res = b.run(comp, level)
            except Exception as exc:  # a compressor this generic driver cannot run: record, continue
                res = {"level": level, "error": f"{type(exc).__name__}: {exc}"}
            report["results"].append({"set": set_name, "compressor": label, "name": name, **res})
            if "t_compress" in res:
                direct[level] = res["t_compress"]["median"]
        ml_levels = [lv for lv in (10.0, 100.0, 1000.0) if lv in direct]
        if comp.multilevel != "none" and len(ml_levels) > 1 and "error" not in report["results"][-1]:
            report["multilevel"].append({"set": set_name, "compressor": label,
                                         **multilevel(b, comp, ml_levels, direct)})


def environment() -> dict[str, Any]:
    def version(pkg: str) -> Optional[str]:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"torch": torch.__version__, "deepspeed": version("deepspeed"), "numpy": version("numpy"),
            "torchvision": version("torchvision"), "python": platform.python_version(), "cpu_model": cpu,
            "cores": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(), "git_commit": commit,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def print_table(report: dict[str, Any]) -> None:
    ms = 1e3
    for set_name, info in report["sets"].items():
        print(f"\n== {set_name}: {info['numel'] / 1e6:.1f}M elements in {info['tensors']} tensors, "
              f"t_pass {info['t_pass']['median'] * ms:.1f} ms (x.abs()), "
              f"{info['t_pass_out']['median'] * ms:.1f} ms (abs into preallocated buffers)")
        print(f"{'compressor':<18}{'level':>7}{'payload MB':>11}{'compress ms':>13}{'passes':>8}{'p/out':>7}"
              f"{'dec2 ms':>9}{'dec4 ms':>9}{'resid ms':>9}{'stage ms':>9}{'GB/s':>7}")
        for r in (r for r in report["results"] if r["set"] == set_name):
            if "t_compress" not in r:
                print(f"{r['compressor']:<18}{r.get('level', 0):>7g}  {r.get('error') or r.get('skipped')}")
                continue
            print(f"{r['compressor']:<18}{r['level']:>7g}{r['payload_bytes'] / 2**20:>11.2f}"
                  f"{r['t_compress']['median'] * ms:>13.1f}{r['passes']['t_compress']:>8.2f}"
                  f"{r['passes_out']['t_compress']:>7.2f}"
                  f"{r['t_decompress_n2']['median'] * ms:>9.1f}{r['t_decompress_n4']['median'] * ms:>9.1f}"
                  f"{r['t_residual']['median'] * ms:>9.1f}{r['t_stage']['median'] * ms:>9.1f}"
                  f"{r['gbps_compress']:>7.2f}")
        for key, label in (("naive_topk", "naive topk"), ("sampled_threshold", "1% sample thr")):
            for r in (r for r in report[key] if r["set"] == set_name):
                print(f"{label:<18}{r['level']:>7g}{'':>11}{r['t']['median'] * ms:>13.1f}{r['passes']:>8.2f}"
                      f"{r['passes_out']:>7.2f}")
        for r in (r for r in report["multilevel"] if r["set"] == set_name):
            print(f"multi-level {r['compressor']}: {' -> '.join(f'{lv:g}' for lv in r['levels'])}: "
                  f"{r['t_multi'] * ms:.1f} ms vs direct {r['t_direct'] * ms:.1f} ms (ratio {r['ratio']:.2f})")


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS), help="comma list of resnet101, vgg16, lstm")
    ap.add_argument("--compressors", default="", help="comma list (default: every registered one)")
    ap.add_argument("--topk-algorithms", default=",".join(TOPK_ALGORITHMS))
    ap.add_argument("--cfs", default="10,100,1000", help="CFs for CF-continuous compressors")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--source", choices=("synthetic", "real"), default="synthetic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure-compute", action="store_true", help="also time each model's forward+backward")
    ap.add_argument("--smoke", action="store_true", help="10^5-element sets, 1 repeat")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    args.sets = [s for s in args.sets.split(",") if s]
    unknown = set(args.sets) - set(SETS)
    if unknown:
        ap.error(f"unknown set(s): {', '.join(sorted(unknown))}")
    args.cfs = [float(c) for c in args.cfs.split(",") if c]
    args.compressors = [c for c in args.compressors.split(",") if c] or registered_names()
    args.topk_algorithms = [a for a in args.topk_algorithms.split(",") if a]
    if args.smoke:
        args.repeats = 1
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    variants = compressor_variants(args.compressors, args.topk_algorithms)
    report: dict[str, Any] = {
        "env": environment(),
        "config": {"sets": args.sets, "compressors": [v[0] for v in variants], "cfs": args.cfs,
                   "repeats": args.repeats, "smoke": args.smoke, "source": args.source, "seed": args.seed},
        "sets": {}, "results": [], "naive_topk": [], "sampled_threshold": [], "multilevel": []}
    for set_name in args.sets:
        bench_set(set_name, args, variants, report)
    print_table(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
