"""The baseline's step measured beside a controller's whole run on the emulated cluster, in the same invocation.

Why: a controller's row at a rate is its own cluster run, timed by the machine of that session; the leading table
divides the baseline's time to target by it. The baseline's kept step may come from another session, and one
system's step moves 15–27% between invocations here (docs/BENCHMARKS.md), more than the ratios we judge. So
``fidelity run --rate R`` ends with a short run of the baseline (``ddp_bf16``) at the same rate into
``<out>/reference/`` (unless it trained the baseline itself); the controllers' rows read its median step, and the
leading table prices the baseline's loopback steps to target with it for those rows: both sides of their ratio
measured side by side.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

from ds_gravac_bench.fidelity_lead import BASELINE
from ds_gravac_bench.fidelity_runs import load_dirs

REFERENCE_DIR = "reference"
REFERENCE_STEPS = 70          # 68 timed steps past the first two: the medians the step-time tables use


def reference_opts(e2e: argparse.Namespace, steps: int) -> argparse.Namespace:
    """The controllers' ``bench_e2e`` options with only the baseline, ``steps`` steps, into ``<out>/reference``:
    same model, rate, cluster, micro batch and runner options, so only the system differs."""
    return argparse.Namespace(**{**vars(e2e), "systems": BASELINE, "steps": steps, "checkpoint_every": 0,
                                 "out": Path(e2e.out) / REFERENCE_DIR})


def needs_reference(systems: str) -> bool:
    """An invocation that trains the baseline itself needs no reference run: its own run is beside the others."""
    return BASELINE not in systems.split(",")


def reference_step(cluster_dir: Path) -> Optional[dict[str, Any]]:
    """The baseline's median step measured in ``cluster_dir``'s invocation: its own run there, else its reference
    run (None without either)."""
    for where in (Path(cluster_dir), Path(cluster_dir) / REFERENCE_DIR):
        curve = load_dirs([where])[1].get(BASELINE) if (where / "meta.json").is_file() else None
        if curve and curve["median_step"] is not None:
            return {"system": BASELINE, "step_s": curve["median_step"]}
    return None
