"""Command-line values of the fidelity tools: cluster run directories and step-time files per link rate."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence


def cluster_arg(value: str) -> tuple[str, list[Path]]:
    """``RATE=DIR[,DIR...]``: bench_e2e outputs on the emulated cluster at one rate."""
    rate, sep, paths = value.partition("=")
    dirs = [Path(p) for p in paths.split(",") if p]
    missing = [str(d) for d in dirs if not (d / "meta.json").exists()]
    if not sep or not rate or not dirs or missing:
        raise argparse.ArgumentTypeError(f"expected RATE=DIR[,DIR...] with each DIR a bench_e2e output (meta.json), "
                                         f"got {value!r}" + (f" ({', '.join(missing)}: no meta.json)" if missing else ""))
    return rate, dirs


def rate_file_arg(value: str) -> tuple[str, Path]:
    """``RATE=FILE``: a ``step_times`` output measured at one rate."""
    rate, sep, path = value.partition("=")
    if not sep or not rate or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"expected RATE=FILE with FILE a step_times output, got {value!r}")
    return rate, Path(path)


def clusters_of(args: Sequence[tuple[str, list[Path]]]) -> dict[str, list[Path]]:
    """Repeated ``--cluster`` arguments of one rate merge."""
    clusters: dict[str, list[Path]] = {}
    for rate, paths in args:
        clusters.setdefault(rate, []).extend(paths)
    return clusters
