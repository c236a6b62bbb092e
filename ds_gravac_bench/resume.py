"""Long benchmark runs that survive an interruption: a loopback system checkpoints every K steps, and running the
same command again continues each unfinished system from its newest complete checkpoint instead of from step 0.

A 6,000-step ResNet-18 run costs about 2 CPU-hours (docs/BENCHMARKS_LONG.md), longer than a working session, so
the long table is built by re-running one command until every system is finished. The runners resume exactly
(weights, optimizer, schedule, residuals, data position and RNG: tests/launcher/test_runners.py); this module only
picks the checkpoint, drops the records written after it (a killed run logged steps its checkpoint does not
hold) and keeps one checkpoint per system on disk.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Optional

CKPT = "ckpt"
TAG = re.compile(r"^step(\d+)$")


def checkpoint_dir(log_dir: Path) -> Path:
    return log_dir / CKPT


def checkpoint_args(log_dir: Path, every: int) -> list[str]:
    """Runner options that write a checkpoint every ``every`` steps and after the last one."""
    return ["--save-dir", str(checkpoint_dir(log_dir)), "--save-every", str(every)]


def _complete_tags(ckpt: Path, ranks: int) -> list[tuple[int, str]]:
    """Tags whose every rank wrote its runner file: the runner writes those last, after the system's own files."""
    tags = []
    for d in ckpt.iterdir() if ckpt.is_dir() else ():
        match = TAG.match(d.name)
        if match and all((d / f"runner_rank{r:05d}.pt").is_file() for r in range(ranks)):
            tags.append((int(match.group(1)), d.name))
    return sorted(tags)


def last_logged_step(log_dir: Path) -> int:
    path = log_dir / "steps.jsonl"
    steps = [json.loads(x).get("step", 0) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    return int(max(steps, default=0))


def resume_point(log_dir: Path, ranks: int) -> Optional[int]:
    """The newest complete checkpoint's step, with ``latest`` pointing at it (a run killed while saving leaves
    ``latest`` on a tag without runner files), or None when there is none."""
    ckpt = checkpoint_dir(log_dir)
    tags = _complete_tags(ckpt, ranks)
    if not tags:
        return None
    step, tag = tags[-1]
    (ckpt / "latest").write_text(tag)
    return step


def truncate_records(log_dir: Path, step: int) -> int:
    """Keep the step records and events up to ``step`` (the resumed run appends from ``step + 1``); returns how
    many records were dropped."""
    dropped = 0
    for name in ("steps.jsonl", "events.jsonl"):
        path = log_dir / name
        if not path.is_file():
            continue
        lines = [x for x in path.read_text().splitlines() if x.strip()]
        kept = [x for x in lines if int(json.loads(x).get("step", 0)) <= step]
        dropped += (len(lines) - len(kept)) if name == "steps.jsonl" else 0
        path.write_text("".join(x + "\n" for x in kept))
    return dropped


def prune(log_dir: Path, ranks: int) -> None:
    """Only the newest complete checkpoint stays (a ResNet-18 tag holds about 0.2 GB)."""
    ckpt = checkpoint_dir(log_dir)
    tags = _complete_tags(ckpt, ranks)
    keep = tags[-1][1] if tags else None
    for d in ckpt.iterdir() if ckpt.is_dir() else ():
        if d.is_dir() and TAG.match(d.name) and d.name != keep:
            shutil.rmtree(d, ignore_errors=True)


def plan_system(log_dir: Path, steps: int, ranks: int, previous: Optional[dict[str, Any]]) -> tuple[str, list[str]]:
    """What a continued invocation does with one system: ``("done", [])`` when an earlier invocation finished it
    (exit 0, every step logged), ``("resume", args)`` from its newest complete checkpoint, else ``("fresh", [])``."""
    if previous is not None and previous.get("returncode") == 0 and last_logged_step(log_dir) >= steps:
        return "done", []
    step = resume_point(log_dir, ranks)
    if step is None:
        return "fresh", []
    truncate_records(log_dir, step)
    prune(log_dir, ranks)
    return "resume", ["--resume", str(checkpoint_dir(log_dir))]
