"""Refuse to train against a dense run restored from another machine class.

Why: a kept seed continues on another machine by restoring its dense run (``long_keep restore``), and every system
trained there is judged against that curve. A loss curve follows the kernels that made it (docs/BENCHMARKS_LONG.md,
"Cost": an AVX-512 AMD EPYC leaves the Intel Xeon's ResNet-18 curve at step 2 unless MKL takes its Intel path,
``mkl_vendor.py``), so on another machine class every new row would be compared with a dense run that machine cannot
reproduce: a gap of chaos, not of compression, and nothing in the report would show it. So before an invocation
trains anything into a directory whose dense run was restored, this machine trains that dense run for up to a
minute, and it must give back every logged loss bit for bit.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ds_gravac_bench.report import read_steps

MARKER = "restored.json"          # in the restored system's directory: where its curve came from
CHECK_DIR = "machine-check"       # the check's own run, inside the directory it checks
CHECK_SECONDS = 60.0
# What to do when a machine leaves a kept curve (``long_keep match`` and the check below say it alike).
REMEDY = ("Train that seed on its own machine class, or make this one train as it does (an AMD CPU: MKL on its Intel "
          "path for an Intel Xeon's curve, python -m ds_gravac_bench.mkl_vendor; caps to AVX2 for an AVX2 CPU's; "
          "docs/BENCHMARKS_LONG.md, \"Cost\")")


def mark_restored(run_dir: Path, system: str, source: str, env: Optional[dict[str, Any]]) -> None:
    (run_dir / "systems" / system / MARKER).write_text(json.dumps({"from": source, "env": env}, indent=1) + "\n")


def restored_reference(run_dir: Path) -> Optional[str]:
    """The system whose run was restored into ``run_dir`` rather than trained there (None: every run is its own)."""
    systems = run_dir / "systems"
    found = sorted(p.parent.name for p in systems.glob(f"*/{MARKER}")) if systems.is_dir() else []
    return found[0] if found else None


def first_difference(kept: Sequence[dict[str, Any]], here: Sequence[dict[str, Any]]) -> tuple[int, Optional[int]]:
    """(steps compared, the first step at which ``here`` logs another step or loss than ``kept``, None if none)."""
    pairs = list(zip(kept, here))
    for a, b in pairs:
        if int(a["step"]) != int(b["step"]) or float(a["loss"]) != float(b["loss"]):
            return len(pairs), int(b["step"])
    return len(pairs), None


def check_restored(run_dir: Path, train: Callable[[Path, str], None]) -> Optional[int]:
    """If ``run_dir``'s dense run was restored, ``train(check_dir, system)`` runs it here for a while and its steps
    must equal the restored ones; returns the steps compared (None: nothing restored, nothing to check)."""
    ref = restored_reference(run_dir)
    if ref is None:
        return None
    check_dir = run_dir / CHECK_DIR
    shutil.rmtree(check_dir, ignore_errors=True)
    train(check_dir, ref)
    source = json.loads((run_dir / "systems" / ref / MARKER).read_text())
    n, differs = first_difference(read_steps(run_dir / "systems" / ref / "steps.jsonl"),
                                  read_steps(check_dir / "systems" / ref / "steps.jsonl"))
    made_on = (source.get("env") or {}).get("cpu", "another machine")
    if n == 0:
        raise SystemExit(f"machine check: {ref} logged no step here within {CHECK_SECONDS:g} s ({check_dir}); "
                         f"cannot tell whether this machine trains the curve restored into {run_dir}")
    if differs is not None:
        raise SystemExit(f"machine check: this machine leaves {run_dir}'s {ref} curve (restored from "
                         f"{source['from']}, made on {made_on}) at step {differs}: rows trained here would be judged "
                         f"against a dense run it cannot reproduce. {REMEDY}; nothing was trained")
    print(f"[machine check] {run_dir}: this machine gives back {ref}'s restored curve bit for bit over {n} steps",
          flush=True)
    return n


def check_before_training(e2e: argparse.Namespace) -> None:
    """``bench_e2e`` options about to train on loopback into ``e2e.out``: when its dense run was restored, this
    machine trains it into ``CHECK_DIR`` for ``CHECK_SECONDS`` first (:func:`check_restored`); skipped when every
    system named has finished there."""
    from ds_gravac_bench.e2e import run_matrix

    out = Path(e2e.out)
    meta = out / "meta.json"
    recorded = json.loads(meta.read_text()).get("systems", {}) if meta.is_file() else {}
    finished = {sid for sid, m in recorded.items() if m.get("returncode") == 0}
    if restored_reference(out) is None or set(e2e.systems.split(",")) <= finished:
        return
    check_restored(out, lambda check_dir, sid: run_matrix(argparse.Namespace(**{
        **vars(e2e), "systems": sid, "out": check_dir, "timeout": CHECK_SECONDS, "checkpoint_every": 0})))
