"""Command-line values of the fidelity tools: link rates, cluster run directories and step-time files per rate.

A rate names rows and keys tables (``gv_auto at 1gbit``, issue 42's targets per rate), so it is parsed as tc parses
it and written one way: ``1000mbit`` and ``1Gbit`` are ``1gbit``, and a typo fails here instead of never matching."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ds_gravac_bench.netns import ClusterError, parse_rate

_NAMES = ((1e9, "gbit"), (1e6, "mbit"), (1e3, "kbit"), (1.0, "bit"))


def rate_name(value: str) -> str:
    """The canonical name of a tc rate: the largest decimal unit that divides it (``100mbit``, ``1gbit``)."""
    try:
        bits = parse_rate(value)
    except ClusterError as err:
        raise argparse.ArgumentTypeError(f"link rate: {err}") from None
    if not bits > 0:
        raise argparse.ArgumentTypeError(f"link rate: {value!r} is not positive; use e.g. 100mbit or 1gbit")
    for scale, unit in _NAMES:
        if bits >= scale and float(bits / scale).is_integer():
            return f"{int(bits / scale)}{unit}"
    return f"{bits:g}bit"


def rate_or_loopback(value: str) -> str:
    """``loopback`` or a canonical tc rate (``fidelity run --rate``)."""
    return "loopback" if value.strip().lower() == "loopback" else rate_name(value)


def cluster_arg(value: str) -> tuple[str, list[Path]]:
    """``RATE=DIR[,DIR...]``: bench_e2e outputs on the emulated cluster at one rate."""
    rate, sep, paths = value.partition("=")
    rate = rate_name(rate) if sep and rate else rate
    dirs = [Path(p) for p in paths.split(",") if p]
    missing = [str(d) for d in dirs if not (d / "meta.json").exists()]
    if not sep or not rate or not dirs or missing:
        raise argparse.ArgumentTypeError(f"expected RATE=DIR[,DIR...] with each DIR a bench_e2e output (meta.json), "
                                         f"got {value!r}" + (f" ({', '.join(missing)}: no meta.json)" if missing else ""))
    return rate, dirs


def rate_file_arg(value: str) -> tuple[str, Path]:
    """``RATE=FILE``: a ``step_times`` output measured at one rate."""
    rate, sep, path = value.partition("=")
    rate = rate_name(rate) if sep and rate else rate
    if not sep or not rate or not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"expected RATE=FILE with FILE a step_times output, got {value!r}")
    return rate, Path(path)


def clusters_of(args: Sequence[tuple[str, list[Path]]]) -> dict[str, list[Path]]:
    """Repeated ``--cluster`` arguments of one rate merge."""
    clusters: dict[str, list[Path]] = {}
    for rate, paths in args:
        clusters.setdefault(rate, []).extend(paths)
    return clusters
