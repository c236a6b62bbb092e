"""Where the long tables stand: every run directory under a root, each system's logged steps against its budget,
its newest complete checkpoint, exit code and recorded cost.

    python -m ds_gravac_bench.long_status runs/long [--kept docs/bench/long]

Why: a long table is built over many sessions, one resumable invocation at a time (docs/BENCHMARKS_LONG.md), and
what is finished, what resumes from where, and what it cost so far must be read off the disk, not remembered. A
system is "done" when it exited 0 with every step logged — the rule a continued invocation uses to skip it
(``resume.plan_system``) — "resumes at K" when a complete checkpoint exists, "failed (exit E)" when it stopped
without one, else "pending" (listed in the directory but never started). ``--kept`` also lists what the repository
keeps (``long_keep``): the systems of each kept seed, which survive a new machine.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.resume import last_logged_step, resume_point


def system_state(log_dir: Path, steps: int, ranks: int, recorded: Optional[dict[str, Any]]) -> str:
    logged = last_logged_step(log_dir) if (log_dir / "steps.jsonl").is_file() else 0
    if recorded is not None and recorded.get("returncode") == 0 and logged >= steps:
        return "done"
    ckpt = resume_point(log_dir, ranks) if log_dir.is_dir() else None
    if ckpt is not None:
        return f"resumes at {ckpt}"
    if recorded is not None and recorded.get("returncode") not in (None, 0):
        return f"failed (exit {recorded['returncode']})"
    return "pending" if logged == 0 else f"restarts (step {logged} logged, no checkpoint)"


def directory_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per system a directory's meta.json records or its systems/ folder holds."""
    meta = json.loads((run_dir / "meta.json").read_text())
    steps, ranks = int(meta["steps"]), int(meta.get("N", 2))
    recorded = meta.get("systems", {})
    on_disk = sorted(p.name for p in (run_dir / "systems").iterdir()) if (run_dir / "systems").is_dir() else []
    rows = []
    for sid in list(recorded) + [s for s in on_disk if s not in recorded]:
        log_dir = run_dir / "systems" / sid
        m = recorded.get(sid)
        rows.append({"dir": run_dir.name, "rate": meta.get("network", {}).get("rate", "?"), "system": sid,
                     "steps": steps, "logged": last_logged_step(log_dir) if (log_dir / "steps.jsonl").is_file() else 0,
                     "state": system_state(log_dir, steps, ranks, m),
                     "cpu_h": None if not m or m.get("cpu_s") is None else m["cpu_s"] / 3600.0})
    return rows


def status(root: Path) -> list[dict[str, Any]]:
    return [row for meta in sorted(root.rglob("meta.json")) for row in directory_rows(meta.parent)]


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| directory | rate | system | logged / budget | state | CPU-hours recorded |", "|---|---|---|---|---|---|"]
    for r in rows:
        cpu = "–" if r["cpu_h"] is None else f"{r['cpu_h']:.2f}"
        lines.append(f"| {r['dir']} | {r['rate']} | {r['system']} | {r['logged']} / {r['steps']} | {r['state']} | "
                     f"{cpu} |")
    return "\n".join(lines) + "\n"


def kept(root: Path) -> list[dict[str, Any]]:
    """Each kept seed under ``root`` (a directory with a ``fidelity.json``): its budget and the systems it keeps."""
    out = []
    for report in sorted(root.rglob("fidelity.json")):
        table = json.loads(report.read_text())
        out.append({"dir": report.parent.name, "steps": table["steps"],
                    "systems": [r["id"] for r in table["systems"]]})
    return out


def kept_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| kept | budget | systems |", "|---|---|---|"]
    lines += [f"| {r['dir']} | {r['steps']} | {', '.join(r['systems'])} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="a directory holding run directories (each with a meta.json), e.g. runs/long")
    ap.add_argument("--kept", default=None, help="a directory of kept seeds (long_keep), e.g. docs/bench/long")
    a = ap.parse_args(argv)
    print(markdown(status(Path(a.root))), end="")
    if a.kept:
        print("\n" + kept_markdown(kept(Path(a.kept))), end="")


if __name__ == "__main__":
    main()
