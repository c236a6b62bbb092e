"""runners/auto_heatmap.py: the grid it draws is the records' per-group levels, in first-seen group order, with
gaps where a record lacks a group; a run without auto levels draws nothing."""
from __future__ import annotations

import json
import math

from runners.auto_heatmap import level_grid, main, plot

RECORDS = [{"step": 1, "loss": 2.0},                                            # before the first decision
           {"step": 2, "auto/level/64x64": 0.0, "auto/level/classifier": 0.0},
           {"step": 3, "auto/level/64x64": 16.0, "auto/level/classifier": 0.0, "auto/level/vectors": 0.0},
           {"step": 4, "auto/level/64x64": 4.0, "auto/level/classifier": 16.0, "auto/level/vectors": 0.0}]


def test_grid_is_the_records_levels() -> None:
    groups, steps, grid = level_grid(RECORDS)
    assert groups == ["64x64", "classifier", "vectors"] and steps == [2, 3, 4]
    assert grid[0] == [0.0, 16.0, 4.0] and grid[1] == [0.0, 0.0, 16.0]
    assert math.isnan(grid[2][0]) and grid[2][1:] == [0.0, 0.0]


def test_plot_and_command_line(tmp_path) -> None:
    assert plot(RECORDS, tmp_path / "a.png").stat().st_size > 0
    assert plot([{"step": 1, "loss": 1.0}], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    jsonl = tmp_path / "steps.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    try:
        main([str(jsonl)])
    except SystemExit as done:
        assert done.code == 0
    assert (tmp_path / "auto_levels.png").stat().st_size > 0
