"""Compact result files: what the repository keeps of a table's runs (raw runs stay under ``runs/``, ignored).

    python -m ds_gravac_bench.keep docs/bench/step_time.json --title "Step time" \\
        --command "python -m ds_gravac_bench.e2e run ..." runs/e2e-r101-1g runs/e2e-r101-100m

Each source is a ``bench_e2e`` output (its ``results.json`` without the per-step curves), a fidelity report
(``fidelity.json``), a multi-seed summary (``seeds.json``) or any other JSON report (a micro-benchmark's). Every
absolute path in them becomes its last component: a kept file names no directory of the machine that ran it.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.report import shown_path

# a path from the root: a "/" not inside a word, a relative path or a URL, then names (the last one captured)
_ABSOLUTE = re.compile(r"(?<![\w.~/:])/(?:[\w.+-]+/)*([\w.+-]+)/?")
_CURVES = ("loss", "smoothed", "step_times", "cf_sent", "branch")       # per-step lists of an e2e system


def strip_paths(value: Any) -> Any:
    """``value`` with every absolute path inside its strings replaced by the path's last component."""
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: m.group(1), value)
    if isinstance(value, list):
        return [strip_paths(v) for v in value]
    if isinstance(value, dict):
        return {strip_paths(k): strip_paths(v) for k, v in value.items()}
    return value


def compact_e2e(results: dict[str, Any]) -> dict[str, Any]:
    """An e2e ``results.json`` without the per-step curves (the medians, bytes and times to target stay)."""
    systems = [{k: v for k, v in s.items() if k not in _CURVES} for s in results["systems"]]
    return {**{k: v for k, v in results.items() if k != "systems"}, "systems": systems}


def compact(source: Path) -> dict[str, Any]:
    """The compact form of one report directory (or JSON file), paths stripped."""
    if source.is_file():
        return strip_paths(json.loads(source.read_text()))
    for name in ("results.json", "seeds.json", "fidelity.json"):
        if (source / name).is_file():
            data = json.loads((source / name).read_text())
            return strip_paths(compact_e2e(data) if name == "results.json" else data)
    raise SystemExit(f"keep: {source} holds no results.json, seeds.json or fidelity.json")


def keep(out: Path, sources: Sequence[Path], title: str, command: str, commit: Optional[str] = None) -> dict:
    """Write one table's compact result file: its title, its command and each source's compact report."""
    kept = {"table": title, "command": command, "commit": commit,
            "sources": {shown_path(s): compact(s) for s in sources}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(kept, indent=1, sort_keys=False) + "\n")
    return kept


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the compact JSON file to write")
    ap.add_argument("sources", nargs="+", type=Path, help="report directories or JSON files")
    ap.add_argument("--title", required=True, help="the table these results back")
    ap.add_argument("--command", required=True, help="the command that reproduces the table")
    ap.add_argument("--commit", default=None, help="the commit whose tree held the raw runs")
    a = ap.parse_args(argv)
    keep(a.out, a.sources, a.title, a.command, a.commit)
    print(f"[keep] {a.out}: {len(a.sources)} sources, {a.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
