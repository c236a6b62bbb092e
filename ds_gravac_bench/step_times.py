"""The median step of each system of short step-time runs on the emulated cluster, as one compact file per table.

    python -m ds_gravac_bench.step_times docs/bench/long_step_times_lstm.json --title "..." --command "..." \\
        1gbit=runs/long/lstm-steps-1gbit 100mbit=runs/long/lstm-steps-100mbit

Each run directory is a ``fidelity run --rate RATE --steps K`` output; the first ``--skip`` steps of every system
(start-up, allocation) are left out of its median. Time to target prices these medians with the loopback steps
(``fidelity report --cluster RATE=DIR``); this file is what the docs' step-time table shows.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Sequence

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


def rate_table(run_dir: Path, skip: int) -> dict[str, Any]:
    """Every finished system of one run directory, the measured link rate and the environment."""
    meta = json.loads((run_dir / "meta.json").read_text())
    systems = {d.name: system_steps(d, skip) for d in sorted((run_dir / "systems").iterdir())
               if (d / "steps.jsonl").is_file()}
    env = {k: meta.get("env", {}).get(k) for k in ("torch", "deepspeed", "cpu", "cores")}
    mbit = meta.get("network", {}).get("measured_mbit")
    return {"systems": systems, "measured_mbit": round(float(mbit), 1) if mbit else None, "env": env}


def build(rates: Sequence[tuple[str, Path]], title: str, command: str, skip: int) -> dict[str, Any]:
    return strip_paths({"title": title, "command": command, "skip_steps": skip,
                        "rates": {rate: rate_table(path, skip) for rate, path in rates}})


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", nargs="+", help="RATE=DIR, one per rate")
    ap.add_argument("--title", required=True)
    ap.add_argument("--command", required=True, help="the fidelity commands that made the runs")
    ap.add_argument("--skip", type=int, default=2)
    args = ap.parse_args(argv)
    rates = []
    for item in args.runs:
        rate, sep, path = item.partition("=")
        if not sep or not rate or not path:
            raise SystemExit(f"step_times: expected RATE=DIR, got {item!r}")
        rates.append((rate, Path(path)))
    args.out.write_text(json.dumps(build(rates, args.title, args.command, args.skip), indent=1) + "\n")


if __name__ == "__main__":
    main()
