"""How a report names a GraVAC row whose first window never ended.

GraVAC searches CFs only at window boundaries: the first one is the step after ``warmup_steps + window``. A run of
at most that many steps never reaches it, so its controller keeps its first θ_min / θ_c for the whole run and the
row measures a static setting, not the controller. Reports say so in the row's label instead of calling it GraVAC.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ds_gravac.config import parse_config


def run_section(outdir: Path, sid: str) -> Optional[dict[str, Any]]:
    """The "gravac" section a bench_e2e system ran (``configs/<id>.json``); None for DeepSpeed's and DDP's paths."""
    path = Path(outdir) / "configs" / f"{sid}.json"
    return json.loads(path.read_text()).get("gravac") if path.exists() else None


def window_never_reached(section: Optional[Mapping[str, Any]], steps: int) -> bool:
    """A ``mode: "gravac"`` section whose run of ``steps`` steps ends before its first window boundary."""
    if not section or section.get("mode") != "gravac":
        return False
    cfg = parse_config(section)
    return int(steps) <= cfg.warmup_steps + cfg.gravac.window


def system_label(sid: str, section: Optional[Mapping[str, Any]], steps: int,
                 cf_sent: Sequence[Optional[float]] = ()) -> str:
    """``sid``, or ``sid (window never reached: static θ …)`` naming the compressed levels the run sent
    (``static θ_min`` when the records do not say)."""
    if not window_never_reached(section, steps):
        return sid
    sent = sorted({float(c) for c in cf_sent if c is not None and float(c) > 1.0})
    levels = "θ " + "/".join(f"{c:g}" for c in sent) if sent else "θ_min"
    return f"{sid} (window never reached: static {levels})"


__all__ = ["run_section", "system_label", "window_never_reached"]
