"""Turn the per-system step records of one ``bench_e2e`` invocation into ``results.json``, ``results.md``,
``steps_loss_time.csv`` and plots. Pure post-processing: rerun with
``python -m ds_gravac_bench.e2e report <dir>``."""
from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any, Optional

from .gravac_label import run_section, system_label

SKIP_STEPS = 2          # the dense discovery step and one warm-up step are not representative


def shown_path(path: Path | str) -> str:
    """How a report names a directory: relative to the working directory when it lies below it, else its last
    component. Reports are kept and shared, so they never carry the absolute paths of the machine that wrote them."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return p.name


def read_steps(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def smooth(values: list[float], alpha: float = 0.1) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def _pct(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def _median(records: list[dict], key: str) -> Optional[float]:
    vals = [float(r[key]) for r in records if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def system_summary(sid: str, records: list[dict], meta: dict[str, Any]) -> dict[str, Any]:
    body = records[SKIP_STEPS:] or records
    times = [float(r["time/step"]) for r in body if r.get("time/step") is not None]
    losses = [float(r["loss"]) for r in records]
    bytes_logical = _median(body, "bytes_sent")
    veth = meta.get("veth_bytes")
    return {
        "id": sid, "label": system_label(sid, meta.get("gravac"), len(records), [r.get("cf_sent") for r in records]),
        "config_hash": meta.get("config_hash"), "returncode": meta.get("returncode"),
        "steps": len(records), "note": meta.get("note", ""),
        "step_time": {"median": statistics.median(times) if times else None, "p10": _pct(times, 0.1),
                      "p90": _pct(times, 0.9), "compute": _median(body, "time/compute_est"),
                      "codec": _median(body, "time/codec") or 0.0, "comm_exposed": _median(body, "comm_wait_s")},
        "bytes_per_step": {"logical": bytes_logical,
                           "veth": veth / len(records) if veth and records else None},
        "cf_sent": [r.get("cf_sent") for r in records], "branch": [r.get("branch") for r in records],
        "loss": losses, "smoothed": smooth(losses), "step_times": [float(r.get("time/step") or 0) for r in records],
        "final": {"loss": smooth(losses)[-1] if losses else None},
        "peak_rss_mb": max((float(r["mem/peak_rss_mb"]) for r in records if r.get("mem/peak_rss_mb")), default=None),
    }


def time_to_target(summary: dict[str, Any], target: float) -> Optional[float]:
    elapsed = 0.0
    for t, s in zip(summary["step_times"], summary["smoothed"]):
        elapsed += t
        if s <= target:
            return elapsed
    return None


def add_comparisons(systems: list[dict], bandwidth_bps: Optional[float]) -> Optional[float]:
    """Target loss, time to target, speed-ups and the physical bound, all relative to this invocation's runs."""
    by_id = {s["id"]: s for s in systems}
    ref = by_id.get("ds_dense")
    target = None
    if ref and ref["smoothed"]:
        target = ref["smoothed"][max(0, int(0.75 * len(ref["smoothed"])) - 1)]
    measured = by_id.get("compute_only", {}).get("step_time", {}).get("median")
    compute = measured if measured is not None else (by_id.get("gv_dense") or ref or {}).get("step_time", {}).get("compute")
    for s in systems:    # every time first: the references may come later in the run order
        s["time_to_target_s"] = time_to_target(s, target) if target is not None and loss_comparable(s) else None
    for s in systems:
        for name, base in (("speedup_vs_ds_dense", by_id.get("ds_dense")), ("speedup_vs_topk10", by_id.get("gv_topk_10"))):
            mine, theirs = s["time_to_target_s"], base.get("time_to_target_s") if base else None
            s[name] = theirs / mine if mine and theirs else None
        v = s["bytes_per_step"]["logical"]
        wire = v * 8 / bandwidth_bps if v is not None and bandwidth_bps else None
        comp = (compute or 0.0) + (s["step_time"]["codec"] or 0.0)
        t_bound = max(comp, wire or 0.0) if (compute is not None or wire is not None) else None
        med = s["step_time"]["median"]
        s["bound"] = {"t_bound": t_bound, "wire_s": wire, "gap": med / t_bound if med and t_bound else None,
                      "t_compute": compute, "t_compute_measured": measured is not None,
                      "step_over_compute": med / compute if med and compute else None}
    return target


def loss_comparable(system: dict[str, Any]) -> bool:
    """The compute-only rows train one rank on the whole data stream: only their step time means something."""
    return not system["id"].startswith("compute_only")


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _compute_line(results: dict[str, Any]) -> str:
    first = results["systems"][0]["bound"] if results["systems"] else {}
    engine = next((s["step_time"]["median"] for s in results["systems"] if s["id"] == "compute_only_engine"), None)
    through_engine = "" if engine is None else f" (through a DeepSpeed engine, all-reduce off: {_fmt(engine, 3)} s)"
    if first.get("t_compute_measured"):
        return (f"Compute-only step T_compute (one single-rank process per core at once, no communication): "
                f"{_fmt(first.get('t_compute'), 3)} s{through_engine}; bound = max(T_compute + T_codec, bytes / "
                f"measured rate).")
    return (f"T_compute (no compute_only run: gv_dense's compute estimate): {_fmt(first.get('t_compute'), 3)} s; "
            f"bound = max(T_compute + T_codec, bytes / measured rate).")


def markdown(results: dict[str, Any]) -> str:
    net = results["network"]
    lines = [f"# {results['model']} — {results['N']} ranks at {net['rate']} (measured all-reduce "
             f"{_fmt(net.get('measured_mbit'), 0)} Mbit/s), {results['steps']} steps",
             "", f"Target loss (ds_dense smoothed at 75% of the budget): {_fmt(results['target_loss'], 4)}", "",
             _compute_line(results), "",
             "| system | step s (p10–p90) | compute / codec / comm s | bytes/step logical (veth) | time to target s "
             "| vs ds_dense | vs topk10 | final loss | bound s | gap | step / compute-only | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in results["systems"]:
        st, b = s["step_time"], s["bytes_per_step"]
        lines.append(
            f"| {s.get('label', s['id'])} | {_fmt(st['median'])} ({_fmt(st['p10'])}–{_fmt(st['p90'])}) | "
            f"{_fmt(st['compute'])} / "
            f"{_fmt(st['codec'])} / {_fmt(st['comm_exposed'])} | {_fmt((b['logical'] or 0) / 1e6, 2)} MB "
            f"({_fmt((b['veth'] or 0) / 1e6, 2)} MB) | {_fmt(s['time_to_target_s'], 1)} | "
            f"{_fmt(s['speedup_vs_ds_dense'])}x | {_fmt(s['speedup_vs_topk10'])}x | {_fmt(s['final']['loss'], 4)} | "
            f"{_fmt(s['bound']['t_bound'])} | {_fmt(s['bound']['gap'])} | {_fmt(s['bound'].get('step_over_compute'))} | "
            f"{_fmt(s.get('peak_rss_mb'), 0)} |")
    lines += ["", "veth bytes include start-up traffic (DeepSpeed's parameter broadcast at initialize), divided by "
              "the step count; logical bytes are the ds_gravac accounting (docs/design.md). Peak RSS: rank 0's "
              "resident set high-water mark (ranks are symmetric), libraries included.",
              "Paper reference numbers (GraVAC, 32 V100s): speed-up over static Top-k 10x — ResNet101 4.32×, VGG16 "
              "1.95×, LSTM 6.67× (the paper's, not measured here)."]
    return "\n".join(lines) + "\n"


def plots(results: dict[str, Any], outdir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    outdir.mkdir(parents=True, exist_ok=True)
    made = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in results["systems"]:
        if not loss_comparable(s):
            continue
        wall, acc = [], 0.0
        for t in s["step_times"]:
            acc += t
            wall.append(acc)
        ax.plot(wall, s["smoothed"], label=s["id"])
    ax.set_xlabel("wall time (s, cumulative step time)"), ax.set_ylabel("smoothed training loss")
    ax.legend(fontsize=6), fig.tight_layout(), fig.savefig(outdir / "loss_vs_wall.png", dpi=110), plt.close(fig)
    made.append("loss_vs_wall.png")
    fig, ax = plt.subplots(figsize=(7, 3))
    for s in results["systems"]:
        if s["id"].startswith(("gv_gravac", "gv_accordion")):
            ax.step(range(len(s["cf_sent"])), [c or 1 for c in s["cf_sent"]], where="post", label=s["id"])
    ax.set_yscale("log"), ax.set_xlabel("step"), ax.set_ylabel("CF sent (1 = dense)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    fig.tight_layout(), fig.savefig(outdir / "cf_vs_step.png", dpi=110), plt.close(fig)
    made.append("cf_vs_step.png")
    ids = [s["id"] for s in results["systems"]]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(ids))
    ax.bar([x - 0.2 for x in xs], [s["bytes_per_step"]["logical"] or 0 for s in results["systems"]], 0.4,
           label="logical")
    ax.bar([x + 0.2 for x in xs], [s["bytes_per_step"]["veth"] or 0 for s in results["systems"]], 0.4, label="veth")
    ax.set_yscale("log"), ax.set_xticks(list(xs)), ax.set_xticklabels(ids, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("bytes per step per rank"), ax.legend(), fig.tight_layout()
    fig.savefig(outdir / "bytes_per_step.png", dpi=110), plt.close(fig)
    made.append("bytes_per_step.png")
    fig, ax = plt.subplots(figsize=(8, 3.5))
    comp = [s["step_time"]["compute"] or 0 for s in results["systems"]]
    codec = [s["step_time"]["codec"] or 0 for s in results["systems"]]
    comm = [s["step_time"]["comm_exposed"] or 0 for s in results["systems"]]
    opaque = [(s["step_time"]["median"] or 0) if s["step_time"]["compute"] is None else 0 for s in results["systems"]]
    ax.bar(xs, comp, label="compute"), ax.bar(xs, codec, bottom=comp, label="codec")
    ax.bar(xs, comm, bottom=[a + b for a, b in zip(comp, codec)], label="exposed comm")
    ax.bar(xs, opaque, color="0.6", label="step (no breakdown: DeepSpeed/DDP)")
    ax.set_xticks(list(xs)), ax.set_xticklabels(ids, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("seconds per step (median)"), ax.legend(), fig.tight_layout()
    fig.savefig(outdir / "step_breakdown.png", dpi=110), plt.close(fig)
    made.append("step_breakdown.png")
    return made


REQUIRED_KEYS = {"env", "network", "model", "N", "steps", "target_loss", "systems"}
SYSTEM_KEYS = {"id", "config_hash", "step_time", "bytes_per_step", "time_to_target_s", "speedup_vs_ds_dense",
               "speedup_vs_topk10", "final", "bound"}


def validate(results: dict[str, Any]) -> None:
    """Raise ValueError unless ``results`` has every key results.json must have (the e2e smoke test checks it)."""
    missing = REQUIRED_KEYS - set(results)
    if missing:
        raise ValueError(f"results.json lacks {sorted(missing)}")
    for s in results["systems"]:
        lack = SYSTEM_KEYS - set(s)
        if lack:
            raise ValueError(f"system {s.get('id')} lacks {sorted(lack)}")
        if not {"median", "p10", "p90", "compute", "codec", "comm_exposed"} <= set(s["step_time"]):
            raise ValueError(f"system {s['id']} step_time incomplete")


def write_steps_csv(results: dict[str, Any], path: Path) -> None:
    """Every system's per-step loss, step time and sent CF in one table (the curves behind the plots)."""
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["system", "step", "loss", "time_step", "cf_sent"])
        for s in results["systems"]:
            for i, (loss, t) in enumerate(zip(s["loss"], s["step_times"])):
                cf = s["cf_sent"][i] if i < len(s["cf_sent"]) else None
                out.writerow([s["id"], i + 1, f"{loss:.6g}", f"{t:.5g}", "" if cf is None else f"{cf:g}"])


def report(outdir: Path) -> dict[str, Any]:
    """(Re)build results.json, results.md and plots from ``outdir/meta.json`` and the step files."""
    from runners.auto_heatmap import plot as auto_heatmap

    meta = json.loads((outdir / "meta.json").read_text())
    records = {sid: read_steps(outdir / "systems" / sid / "steps.jsonl") for sid in meta["systems"]}
    systems = [system_summary(sid, records[sid], {**m, "gravac": run_section(outdir, sid)})
               for sid, m in meta["systems"].items()]
    bw = meta["network"].get("measured_mbit")
    target = add_comparisons(systems, bw * 1e6 if bw else None)
    results = {"env": meta["env"], "network": meta["network"], "model": meta["model"], "N": meta["N"],
               "steps": meta["steps"], "target_loss": target, "systems": systems, "micro": meta.get("micro", [])}
    validate(results)
    (outdir / "results.json").write_text(json.dumps(results, indent=1))
    (outdir / "results.md").write_text(markdown(results))
    write_steps_csv(results, outdir / "steps_loss_time.csv")
    plots(results, outdir / "plots")
    for sid, recs in records.items():        # mode auto systems: the allocation over training
        auto_heatmap(recs, outdir / "plots" / f"auto_levels_{sid}.png", title=f"auto: level per group ({sid})")
    return results
