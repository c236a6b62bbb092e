"""Shared cases of the multi-seed summary tests: hand-made rows and per-seed reports around one dense row."""
from __future__ import annotations

import json
from pathlib import Path


def _row(sid: str, family: str, final: float, dense: float, top1: float, reach: int, bytes_ratio: float) -> dict:
    return {"id": sid, "family": family, "final_loss": final, "dense_loss": dense, "gap": final / dense - 1,
            "bytes_ratio": bytes_ratio, "rises": False, "steps_to_target": reach, "eval": {"eval/top1": top1}}


def _seed(root: Path, dense: float, dense_top1: float, rows: list[dict]) -> Path:
    root.mkdir()
    table = {"model": "resnet101", "steps": 300, "reference": "ds_dense",
             "systems": [_row("ds_dense", "dense", dense, dense, dense_top1, 200, 1.0)] + rows}
    (root / "fidelity.json").write_text(json.dumps(table))
    return root
