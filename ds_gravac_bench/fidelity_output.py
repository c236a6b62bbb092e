"""Output of the fidelity benchmark: its markdown table and its plots (loss vs step per family, loss vs wall time
per rate), from the result that :func:`ds_gravac_bench.fidelity.build` computes."""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, Optional

from ds_gravac_bench.table_targets import FINAL_EVALS

NOISE_CONTROL = "ds_dense_jitter"


def _excursion(replaced: Optional[dict[str, Any]]) -> str:
    """What the loss target replaced (:mod:`ds_gravac_bench.table_targets`), or nothing."""
    if not replaced:
        return ""
    lo, hi = replaced["window"]
    return (f" (the median of the smoothed curve over steps {lo:,}–{hi:,}: its value at that step, "
            f"{replaced['point']:.4f}, lies {replaced['z']:+.1f} robust standard deviations off it)")


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def markdown(res: dict[str, Any]) -> str:
    rates = list(res["clusters"])
    top1 = res.get("top1_target") is not None
    floor = res.get("noise_floor")
    head = ["system", "family", "final loss (dense)", "gap" + (" (noise floor)" if floor else ""), "eval",
            "bytes / dense", "peak", "steps to target"] + (["steps to top-1 target"] if top1 else [])
    for rate in rates:
        head += [f"{rate} step s", f"{rate} time to target s", f"{rate} × dense"]
        head += [f"{rate} time to top-1 s (× dense)"] if top1 else []
    head.append("bounds")
    lines = [f"# Fidelity — {res['model']}, {res['steps']} steps, 2 ranks",
             "", f"Target: {res['reference']}'s smoothed loss at {round(100 * res['target_fraction'])}% of the budget "
             f"= {res['target_loss']:.4f}" + _excursion(res.get("target_excursion"))
             + (f"; held-out top-1 {100 * res['top1_target']:.2f}% ({res['reference']}'s mean over its last "
                f"{FINAL_EVALS} interim evaluations minus {100 * res['top1_margin']:g} point)" if top1 else "")
             + ". Bounds: final loss ≤ dense + 5%, top-1 within 2 points / perplexity within 5%, < 50% of dense's "
             "bytes, smoothed loss never more than 1% above its start and dense's peak.", ""]
    if floor:
        lines += [f"Noise floor ({NOISE_CONTROL}: dense with its gradients × (1 + 1e-6·N(0,1))): loss gap "
                  f"{100 * floor['gap']:+.1f}%" + (f", top-1 {100 * floor['top1_diff']:+.2f} points"
                                                   if floor.get("top1_diff") is not None else "")
                  + f", steps to target {_fmt(floor['steps_to_target'], 'd')}.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["systems"]:
        ev = ", ".join(f"{k[5:]} {v:.3g}" for k, v in sorted(r["eval"].items()) if k in ("eval/top1", "eval/ppl"))
        gap = f"{100 * r['gap']:+.1f}%" + (f" (±{100 * abs(floor['gap']):.1f}%)" if floor else "")
        cells = [r.get("label", r["id"]), r["family"], f"{r['final_loss']:.3f} ({r['dense_loss']:.3f})", gap,
                 ev or "–", _fmt(r["bytes_ratio"], ".4f"), f"{r['peak']:.2f}", _fmt(r["steps_to_target"], "d")]
        cells += [_fmt(r.get("steps_to_top1"), "d")] if top1 else []
        for rate in rates:
            t = r["rates"][rate]
            cells += [_fmt(t["step_s"], ".2f"), _fmt(t["time_s"], ".0f"), _fmt(t.get("speedup"), ".2f")]
            cells += [f"{_fmt(t.get('top1_time_s'), '.0f')} ({_fmt(t.get('top1_speedup'), '.2f')})"] if top1 else []
        cells.append(r["verdict"])
        lines.append("| " + " | ".join(cells) + " |")
    for f in res.get("failures", []):
        lines.append(f"| {f['id']} | failed (exit {f['returncode']}): {f['error'].replace('|', '/')} |")
    clusters = ", ".join(f"{k} = {v}" for k, v in res["clusters"].items()) or "none"
    for note in res.get("skipped", []):
        lines.append(f"| {note.split(' (')[0]} | not compared: {note.replace('|', '/')} |")
    lines += ["", "Time to target: steps to target on the loopback curve × the system's median cluster step "
              f"(controllers — GraVAC, Accordion, auto: their own cluster run; a row \"X at RATE\" trained only "
              f"there, loss, held-out metric and time). Clusters: {clusters}."]
    return "\n".join(lines) + "\n"


def plots(res: dict[str, Any], outdir: Path, curves: dict[str, dict[str, Any]],
          cluster_curves: dict[str, dict[str, dict[str, Any]]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    families = [f for f in ("sparsification", "low-rank", "quantization")
                if any(r["family"] == f for r in res["systems"])] or ["dense"]
    fig, axes = plt.subplots(1, len(families), figsize=(5 * len(families), 3.8), squeeze=False)
    for ax, fam in zip(axes[0], families):
        for r in res["systems"]:
            if r["family"] in (fam, "dense") and not r.get("same_curve_as"):     # a borrowed curve: drawn once
                ax.plot(range(1, r["steps"] + 1), _row_curve(r, curves, cluster_curves)["smoothed"], label=r["id"],
                        color="k" if r["family"] == "dense" else None)
        ax.axhline(res["target_loss"], color="0.6", ls=":")
        ax.set_title(fam), ax.set_xlabel("step"), ax.set_ylabel("smoothed loss"), ax.legend(fontsize=6)
    fig.tight_layout(), fig.savefig(outdir / "loss_vs_step.png", dpi=110), plt.close(fig)
    for rate in res["clusters"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in res["systems"]:
            t = r["rates"][rate]
            if t["step_s"] is None:
                continue
            run = (cluster_curves[rate].get(r.get("system", r["id"]))
                   or cluster_curves[rate].get(r["section_hash"]))
            if t["source"] == "cluster run" and run:
                wall, ys = list(itertools.accumulate(run["times"])), run["smoothed"]
            else:
                ys = curves[r.get("same_curve_as") or r["id"]]["smoothed"]
                wall = [t["step_s"] * (i + 1) for i in range(r["steps"])]
            ax.plot(wall, ys, label=r["id"], color="k" if r["family"] == "dense" else None)
        ax.axhline(res["target_loss"], color="0.6", ls=":")
        ax.set_xscale("log"), ax.set_xlabel(f"wall time at {rate} (s)"), ax.set_ylabel("smoothed loss")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
        fig.tight_layout(), fig.savefig(outdir / f"loss_vs_time_{rate}.png", dpi=110)
        plt.close(fig)


def _row_curve(row: dict[str, Any], curves: dict[str, dict[str, Any]],
               cluster_curves: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The curve a row was computed from: its loopback run, the run it borrows, or its run on the cluster."""
    if row.get("trained_at"):
        return cluster_curves[row["trained_at"]][row["system"]]
    return curves[row.get("same_curve_as") or row["id"]]
