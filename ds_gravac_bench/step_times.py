"""The median step of each system of short step-time runs on the emulated cluster, as one compact file per table.

    python -m ds_gravac_bench.step_times docs/bench/long_step_times_lstm.json --title "..." --command "..." \\
        1gbit=runs/long/lstm-steps-1gbit 100mbit=runs/long/lstm-steps-100mbit

Each run directory is a ``fidelity run --rate RATE --steps K`` output; the first ``--skip`` steps of every system
(start-up, allocation) are left out of its median. Time to target prices these medians with the loopback steps
(``fidelity report --cluster RATE=DIR``); this file is what the docs' step-time table shows.

**Rounds.** One rate given several times (``1gbit=DIR1 1gbit=DIR2 …``: the same invocation repeated, so the
systems run A B C A B C …; ``RATE=DIR1,DIR2`` is one round made by two invocations) gives each system the median
of its per-round medians, those medians, and their spread (max − min over the median): the step-time noise
floor. Why: on this shared 2-core machine one system's 40-step median moves by 15–25% between invocations
(static rank 16 at 1 Gbit/s: 0.48–0.63 s in three rounds), far more than many gaps the tables compare. With
``--reference SYSTEM`` each system also gets the paired ratio reference / system of every round (min, median,
max): a ratio measured side by side, with its spread beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.fidelity_args import cluster_arg
from ds_gravac_bench.keep import strip_paths


def system_steps(directory: Path, skip: int) -> dict[str, Any]:
    """``{"median_s", "mean_s", "steps", "mean_bytes"}`` of one system's ``steps.jsonl``, past its first ``skip``
    steps (the mean prices a system whose steps differ by design, post-local SGD's averaging every period)."""
    rows = [json.loads(line) for line in (directory / "steps.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/step" in r][skip:]
    if not rows:
        raise SystemExit(f"step_times: {directory} has no step past the first {skip}")
    sent = [float(r["bytes_sent"]) for r in rows if r.get("bytes_sent") is not None]
    times = [float(r["time/step"]) for r in rows]
    return {"median_s": round(statistics.median(times), 4), "mean_s": round(statistics.fmean(times), 4),
            "steps": len(rows), "mean_bytes": round(statistics.fmean(sent)) if sent else None}


def rate_table(dirs: Sequence[Path], skip: int) -> dict[str, Any]:
    """Every finished system of one run directory (or of several made back to back, one round: a controller
    resumed from its checkpoint runs in an invocation of its own), the measured link rate and the environment of
    the first."""
    meta = json.loads((dirs[0] / "meta.json").read_text())
    systems = {d.name: system_steps(d, skip) for path in dirs for d in sorted((path / "systems").iterdir())
               if (d / "steps.jsonl").is_file()}
    env = {k: meta.get("env", {}).get(k) for k in ("torch", "deepspeed", "cpu", "cores")}
    mbit = meta.get("network", {}).get("measured_mbit")
    return {"systems": systems, "measured_mbit": round(float(mbit), 1) if mbit else None, "env": env}


def _spread(values: Sequence[float]) -> float:
    return round((max(values) - min(values)) / statistics.median(values), 3)


def rounds_table(rounds: Sequence[Sequence[Path]], skip: int, reference: Optional[str] = None) -> dict[str, Any]:
    """One rate measured in several rounds (see the module docstring); one round: :func:`rate_table`."""
    tables = [rate_table(dirs, skip) for dirs in rounds]
    if len(tables) == 1:
        return tables[0]
    systems: dict[str, Any] = {}
    for name in sorted(set().union(*(t["systems"] for t in tables))):
        per = [t["systems"][name] for t in tables if name in t["systems"]]
        medians = [p["median_s"] for p in per]
        sent = [p["mean_bytes"] for p in per if p["mean_bytes"] is not None]
        row: dict[str, Any] = {"median_s": round(statistics.median(medians), 4),
                               "mean_s": round(statistics.fmean(p["mean_s"] for p in per), 4),
                               "steps": sum(p["steps"] for p in per),
                               "mean_bytes": round(statistics.fmean(sent)) if sent else None,
                               "rounds": len(per), "round_medians": medians, "spread": _spread(medians)}
        paired = [t["systems"][reference]["median_s"] / t["systems"][name]["median_s"] for t in tables
                  if reference is not None and name != reference and name in t["systems"]
                  and reference in t["systems"]]
        if paired:
            row["vs_reference"] = {"system": reference, "median": round(statistics.median(paired), 3),
                                   "min": round(min(paired), 3), "max": round(max(paired), 3)}
        systems[name] = row
    mbit = [t["measured_mbit"] for t in tables if t["measured_mbit"]]
    return {"systems": systems, "measured_mbit": round(statistics.median(mbit), 1) if mbit else None,
            "env": tables[0]["env"], "rounds": len(tables)}


def build(rates: Sequence[tuple[str, Sequence[Path]]], title: str, command: str, skip: int,
          reference: Optional[str] = None) -> dict[str, Any]:
    """One table per rate, in the order the rates first appear; a rate given several times is measured in rounds."""
    dirs: dict[str, list[Sequence[Path]]] = {}
    for rate, paths in rates:
        dirs.setdefault(rate, []).append(paths)
    return strip_paths({"title": title, "command": command, "skip_steps": skip,
                        "rates": {rate: rounds_table(paths, skip, reference) for rate, paths in dirs.items()}})


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", nargs="+", help="RATE=DIR[,DIR…] (one round); a rate given several times: rounds")
    ap.add_argument("--title", required=True)
    ap.add_argument("--command", required=True, help="the fidelity commands that made the runs")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--reference", help="a system of every round: each system's paired ratio reference / system")
    args = ap.parse_args(argv)
    try:
        rates = [cluster_arg(item) for item in args.runs]
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"step_times: {e}") from None
    args.out.write_text(json.dumps(build(rates, args.title, args.command, args.skip, args.reference), indent=1) + "\n")


if __name__ == "__main__":
    main()
