"""Output of the fidelity benchmark: its markdown table and its plots (loss vs step per family, loss vs wall time
per rate), from the result that :func:`ds_gravac_bench.fidelity.build` computes."""
from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec)


def markdown(res: dict[str, Any]) -> str:
    rates = list(res["clusters"])
    head = ["system", "family", "final loss (dense)", "gap", "eval", "bytes / dense", "peak", "steps to target"]
    for rate in rates:
        head += [f"{rate} step s", f"{rate} time to target s", f"{rate} × dense"]
    head.append("bounds")
    lines = [f"# Fidelity — {res['model']}, {res['steps']} steps, 2 ranks",
             "", f"Target: {res['reference']}'s smoothed loss at {round(100 * res['target_fraction'])}% of the budget "
             f"= {res['target_loss']:.4f}. Bounds: final loss ≤ dense + 5%, top-1 within 2 points / perplexity within "
             f"5%, < 50% of dense's bytes, smoothed loss never above its start.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["systems"]:
        ev = ", ".join(f"{k[5:]} {v:.3g}" for k, v in sorted(r["eval"].items()) if k in ("eval/top1", "eval/ppl"))
        cells = [r.get("label", r["id"]), r["family"], f"{r['final_loss']:.3f} ({r['dense_loss']:.3f})",
                 f"{100 * r['gap']:+.1f}%", ev or "–", _fmt(r["bytes_ratio"], ".4f"), f"{r['peak']:.2f}",
                 _fmt(r["steps_to_target"], "d")]
        for rate in rates:
            t = r["rates"][rate]
            cells += [_fmt(t["step_s"], ".2f"), _fmt(t["time_s"], ".0f"), _fmt(t.get("speedup"), ".2f")]
        cells.append(r["verdict"])
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Time to target: steps to target on the loopback curve × the system's median cluster step "
              "(GraVAC rows: their own cluster run). Clusters: " + (", ".join(f"{k} = {v}" for k, v in
                                                                        res["clusters"].items()) or "none") + "."]
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
            if r["family"] in (fam, "dense"):
                ax.plot(range(1, r["steps"] + 1), curves[r["id"]]["smoothed"], label=r["id"],
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
            run = cluster_curves[rate].get(r["id"]) or cluster_curves[rate].get(r["section_hash"])
            if t["source"] == "cluster run" and run:
                wall, ys = list(itertools.accumulate(run["times"])), run["smoothed"]
            else:
                wall, ys = [t["step_s"] * (i + 1) for i in range(r["steps"])], curves[r["id"]]["smoothed"]
            ax.plot(wall, ys, label=r["id"], color="k" if r["family"] == "dense" else None)
        ax.axhline(res["target_loss"], color="0.6", ls=":")
        ax.set_xscale("log"), ax.set_xlabel(f"wall time at {rate} (s)"), ax.set_ylabel("smoothed loss")
        ax.legend(fontsize=6), fig.tight_layout(), fig.savefig(outdir / f"loss_vs_time_{rate}.png", dpi=110)
        plt.close(fig)
