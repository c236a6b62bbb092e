"""M0 of the goodput controller, offline: is a per-group plan predicted to save ≥ 15% of the step over the best
uniform level at equal error?

    python -m ds_gravac_bench.auto_m0 --model resnet101 --rates 100mbit,1gbit

Signals come from one real backward pass per simulated rank (the benchmark's synthetic CIFAR-10 images, batch 32
per rank, the model at its seeded initialization, no residual yet): per group and level the error of the averaged
update (``ds_gravac/adapt/auto/error_model.py``; low rank at the converged warm start, i.e. the SVD tail). Times
come from ``ds_gravac/adapt/auto/timing.py`` with an α–β link at each rate (the emulated cluster's measured fits
by default) and the codec priors. For each family (and the error-feedback families together) it prints the
uniform levels, the best uniform level whose error is within the family reference's, the plan at that budget,
and the predicted saving of the step, plus a sweep of budgets. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Sequence

import torch

from ds_gravac.adapt.auto.error_model import (averaged_qsgd_variance, sparse_unsent, sq_norm, svd_unsent,
                                              variance_budget)
from ds_gravac.adapt.auto.ladder import (DENSE, LOWRANK, QSGD, REFERENCE, SPARSE, Group, Level, build_groups,
                                         family_view, uniform_codes)
from ds_gravac.adapt.auto.solver import solve_view, totals
from ds_gravac.adapt.auto.timing import GEMM, Pricer, calibrate_gemm, link_fits, predicted_step
from ds_gravac.sync.cost_model.fits import LinearFit

QSGD_LEVELS = {8.0: 127, 4.0: 7, 2.0: 1}
RATES = {"100mbit": 1e8, "1gbit": 1e9, "10gbit": 1e10}
# The families the solver budgets together (one unit of error each) and the level their budget comes from.
VIEWS = {"lowrank": ((LOWRANK,), Level(LOWRANK, REFERENCE[LOWRANK])),
         "qsgd": ((QSGD,), Level(QSGD, REFERENCE[QSGD])),
         "sparse": ((SPARSE,), Level(SPARSE, REFERENCE[SPARSE])),
         "ef (lowrank+sparse)": ((LOWRANK, SPARSE), Level(LOWRANK, REFERENCE[LOWRANK]))}


def gradients(model_name: str, ranks: int, batch: int, seed: int, warm_steps: int = 0
              ) -> tuple[list[tuple[str, tuple[int, ...]]], list[dict[str, torch.Tensor]]]:
    """One backward pass per simulated rank on its own batch of the benchmark's synthetic images, after
    ``warm_steps`` dense steps of the benchmark's optimizer (SGD lr 0.001, momentum 0.9, weight decay 1e-4) on
    the ranks' averaged gradients, so that the signals are not only those of the initialization."""
    from runners.data import SyntheticImageDataset
    from runners.models import build_model

    torch.manual_seed(seed)
    model = build_model(model_name, num_classes=10)
    data = SyntheticImageDataset(10, (warm_steps + 1) * ranks * batch, seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=1e-4)
    for step in range(warm_steps + 1):
        grads = []
        for w in range(ranks):
            lo = (step * ranks + w) * batch
            xs, ys = zip(*(data[i] for i in range(lo, lo + batch)))
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(torch.stack(xs)), torch.tensor(ys)).backward()
            grads.append({n: p.grad.detach().double().clone() for n, p in model.named_parameters()})
        if step < warm_steps:
            for n, p in model.named_parameters():
                p.grad = (sum(g[n] for g in grads) / ranks).float()
            opt.step()
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()], grads


def error_table(groups: Sequence[Group], grads: list[dict[str, torch.Tensor]]) -> list[list[float]]:
    """Per group and ladder level: unsent energy of the averaged update (error feedback) or QSGD's variance."""
    n = len(grads)
    out = []
    for g in groups:
        mats = {name: [gr[name].reshape(g.shape) if g.matrix else gr[name].reshape(-1) for gr in grads]
                for name in g.members}
        cfs = [lv.value for lv in g.ladder if lv.family == SPARSE]
        sparse = [0.0] * len(cfs)
        for xs in mats.values():
            sparse = [a + b for a, b in zip(sparse, sparse_unsent([x.reshape(-1) for x in xs], cfs))]
        flat = [torch.cat([gr[name].reshape(-1) for name in g.members]) for gr in grads]
        ranks = [int(lv.value) for lv in g.ladder if lv.family == LOWRANK]
        lowrank = [0.0] * len(ranks)
        for xs in mats.values() if ranks else ():
            lowrank = [a + b for a, b in zip(lowrank, svd_unsent(sum(xs) / n, ranks))]
        row = []
        for lv in g.ladder:
            if lv.family == DENSE:
                row.append(0.0)
            elif lv.family == LOWRANK:
                row.append(lowrank[ranks.index(int(lv.value))])
            elif lv.family == QSGD:
                row.append(averaged_qsgd_variance(flat, QSGD_LEVELS[lv.value]))
            else:
                row.append(sparse[cfs.index(lv.value)])
        out.append(row)
    return out


def uniform_levels(groups: Sequence[Group], families: Sequence[str]) -> list[Level]:
    levels = {lv for g in groups for lv in g.ladder if lv.family in families}
    return [Level(DENSE)] + sorted(levels, key=lambda lv: (lv.family, -lv.value if lv.family != SPARSE
                                                          else lv.value))


def compare(groups: Sequence[Group], times: list[list[float]], errors: list[list[float]], pricer: Pricer,
            compute: float, families: Sequence[str], reference: Level,
            extra: Sequence[tuple[str, float]] = ()) -> dict[str, Any]:
    """Uniform levels, the plan at the reference's error, at every uniform level's error and at the ``extra``
    named budgets (QSGD: the variance an efficiency floor ``E_min`` allows)."""
    view = family_view(groups, families)
    uniform = []
    for lv in uniform_levels(groups, families):
        codes = uniform_codes(groups, lv)
        t, e = totals(times, errors, codes)
        uniform.append({"level": str(lv), "codes": codes, "step_s": compute + t, "error": e,
                        "mb": pricer.payload(groups, codes) / 1e6})
    sweep = []
    budgets = [(u["level"], u["error"]) for u in uniform if u["level"] != "dense"] + list(extra)
    for name, budget in budgets:
        best = min((v for v in uniform if v["error"] <= budget), key=lambda v: v["step_s"])
        t0 = time.perf_counter()
        plan = solve_view(times, errors, budget, view, reference=best["codes"])
        took = time.perf_counter() - t0
        step = predicted_step(compute, times, plan.codes)
        sweep.append({"budget_of": name, "budget": budget, "best_uniform": best["level"],
                      "uniform_step_s": best["step_s"],
                      "plan_step_s": step, "plan_error": plan.error,
                      "plan_mb": pricer.payload(groups, plan.codes) / 1e6,
                      "saving": 1.0 - step / best["step_s"], "exact": plan.exact, "solve_ms": 1e3 * took,
                      "plan": [str(g.ladder[c]) for g, c in zip(groups, plan.codes)]})
    at_ref = next((s for s in sweep if s["budget_of"] == str(reference)), None)    # None: no group takes it
    return {"uniform": [{k: v for k, v in u.items() if k != "codes"} for u in uniform], "sweep": sweep,
            "at_reference": at_ref}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet101")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--alpha", type=float, default=2e-3, help="seconds per collective (cluster fits: 1-3 ms)")
    ap.add_argument("--compute", type=float, default=0.36,
                    help="compute-only step in seconds (issue 42's host: 0.36; BENCHMARKS_HISTORY §3.4's: 0.64)")
    ap.add_argument("--gemm", choices=("prior", "measure"), default="prior")
    ap.add_argument("--gemm-b", type=float, default=None, help="seconds per multiply-add (overrides --gemm)")
    ap.add_argument("--overlap", type=float, default=0.0, help="share of wire time hidden behind backward")
    ap.add_argument("--warm-steps", type=int, default=0, help="dense SGD steps before the signals are taken")
    ap.add_argument("--out", default=None, help="write the whole result as JSON here")
    ap.add_argument("--signals-from", default=None, help="reuse the signals of an earlier --out JSON")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    if args.signals_from:
        with open(args.signals_from) as f:
            saved = json.load(f)
        named = [(n, tuple(s)) for n, s in saved["named"]]
        groups = build_groups(named)
        errors, signal, result_shares = saved["errors"], saved["signal"], saved["shares"]
    else:
        named, grads = gradients(args.model, args.ranks, args.batch, args.seed, args.warm_steps)
        groups = build_groups(named)
        errors = error_table(groups, grads)
        signal = sq_norm(torch.cat([sum(gr[n] for gr in grads).reshape(-1) / len(grads) for n, _ in named]))
        result_shares = {g.name: sq_norm(torch.cat([sum(gr[m] for gr in grads).reshape(-1) / len(grads)
                                                    for m in g.members])) / signal for g in groups}
    print(f"{args.model}: {len(groups)} groups, {sum(g.numel for g in groups):,} values, ‖ḡ‖² = {signal:.4g}; "
          f"signals in {time.perf_counter() - t0:.1f} s")
    codec = {LOWRANK: {GEMM: calibrate_gemm()}} if args.gemm == "measure" else None
    if args.gemm_b is not None:
        codec = {LOWRANK: {GEMM: LinearFit(20e-6, args.gemm_b)}}
    print("share of ‖ḡ‖² per group: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in result_shares.items()))
    result: dict[str, Any] = {"model": args.model, "groups": [g.name for g in groups], "signal": signal,
                              "shares": result_shares, "args": vars(args), "named": named, "errors": errors,
                              "rates": {}}
    for rate_name in args.rates.split(","):
        pricer = Pricer(link_fits(RATES[rate_name], args.alpha, args.ranks), args.ranks, codec=codec,
                        overlap=args.overlap)
        times = pricer.times(groups)
        per_rate = {}
        print(f"\n=== {rate_name} (compute {args.compute:.2f} s) ===")
        for view_name, (families, ref) in VIEWS.items():
            extra = [(f"E_min {e:g}", variance_budget(signal, e)) for e in (0.99, 0.95)] if QSGD in families else []
            res = compare(groups, times, errors, pricer, args.compute, families, ref, extra)
            per_rate[view_name] = res
            print(f"-- {view_name}: uniform levels (step s / error / MB)")
            print("   " + "; ".join(f"{u['level']} {u['step_s']:.3f}/{u['error']:.3g}/{u['mb']:.1f}"
                                    for u in res["uniform"]))
            for s in res["sweep"]:
                mark = " <- reference budget" if s is res["at_reference"] else ""
                print(f"   budget of {s['budget_of']:>14}: best uniform {s['best_uniform']:>14} "
                      f"{s['uniform_step_s']:.3f} s, plan {s['plan_step_s']:.3f} s ({s['plan_mb']:.1f} MB), "
                      f"saving {100 * s['saving']:5.1f}%  [{s['solve_ms']:.1f} ms, exact={s['exact']}]{mark}")
            at = res["at_reference"]
            if at is not None:
                print("   plan at the reference budget: "
                      + ", ".join(f"{g.name}={lv}" for g, lv in zip(groups, at["plan"])))
        result["rates"][rate_name] = per_rate
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
