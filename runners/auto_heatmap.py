"""The allocation ``mode: "auto"`` chose over training, as a heat-map: one row per layer group, one column per
step, the colour the level the group sent (dense, or a PowerSGD rank, QSGD's bits or Top-k's CF, as
``auto/family_code`` says), read from the ``auto/level/<group>`` fields of a run's ``steps.jsonl``.

    python -m runners.auto_heatmap runs/<run>/steps.jsonl --out runs/<run>/auto_levels.png

The runners draw it at the end of every auto run (``<log-dir>/auto_levels.png``, beside ``steps.jsonl``) and the
benchmark report once per auto system (``plots/auto_levels_<id>.png``).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

PREFIX = "auto/level/"
DENSE = 0.0          # the records' code for a group sent plain
# "auto/family_code" → how a level reads, and whether a larger value compresses less (ranks, bits) or more (CFs)
UNITS = {0: ("rank {:g}", True), 1: ("{:g} bits", True), 2: ("CF {:g}", False)}


def level_grid(records: Iterable[dict[str, Any]]) -> tuple[list[str], list[int], list[list[float]]]:
    """Groups (in the order they first appear), the steps that carry auto levels, and ``grid[g][i]`` = the level
    group ``g`` sent at ``steps[i]`` (0 = dense; NaN where a record lacks the group)."""
    groups: list[str] = []
    rows: list[tuple[int, dict[str, float]]] = []
    for r in records:
        levels = {k[len(PREFIX):]: float(v) for k, v in r.items() if k.startswith(PREFIX) and v is not None}
        if not levels:
            continue
        groups += [g for g in levels if g not in groups]
        rows.append((int(r.get("step", len(rows) + 1)), levels))
    grid = [[levels.get(g, math.nan) for _, levels in rows] for g in groups]
    return groups, [s for s, _ in rows], grid


def legend(records: Sequence[dict[str, Any]], grid: Sequence[Sequence[float]]) -> list[tuple[float, str]]:
    """The levels the grid holds, dense first, then from least to most compressed, each with its label."""
    code = next((r["auto/family_code"] for r in records if "auto/family_code" in r), 0)
    label, larger_is_finer = UNITS[int(code)]
    values = sorted({v for row in grid for v in row if math.isfinite(v) and v != DENSE}, reverse=larger_is_finer)
    return [(DENSE, "dense")] + [(v, label.format(v)) for v in values]


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def plot(records: Sequence[dict[str, Any]], out: Path, title: str = "") -> Optional[Path]:
    """Write the heat-map; None when the records hold no auto levels (not an auto run)."""
    groups, steps, grid = level_grid(records)
    if not groups:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    rungs = legend(records, grid)
    ranks = [v for v, _ in rungs[1:]]
    codes = {v: i for i, (v, _) in enumerate(rungs)}
    image = [[codes.get(v, math.nan) if math.isfinite(v) else math.nan for v in row] for row in grid]
    colours = ["#222222"] + [plt.get_cmap("viridis")(i / max(1, len(ranks) - 1)) for i in range(len(ranks))]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(groups) + 1.6))
    ax.imshow(image, aspect="auto", interpolation="nearest", cmap=ListedColormap(colours), vmin=-0.5,
              vmax=len(colours) - 0.5, extent=(steps[0] - 0.5, steps[-1] + 0.5, len(groups) - 0.5, -0.5))
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels(groups, fontsize=6)
    ax.set_xlabel("step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours]
    ax.legend(handles, [name for _, name in rungs], fontsize=6, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "auto: level per group", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps_jsonl", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="default: auto_levels.png beside the records")
    opts = ap.parse_args(argv)
    out = plot(read_records(opts.steps_jsonl), opts.out or opts.steps_jsonl.with_name("auto_levels.png"))
    raise SystemExit(f"{opts.steps_jsonl}: no auto/level fields (not a mode auto run)" if out is None else 0)


if __name__ == "__main__":
    main()
