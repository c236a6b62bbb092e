"""Reading fidelity runs: a system's loss, times, bytes and evaluations from its ``steps.jsonl``, directories of
several invocations merged, and the cluster runs a loopback row is timed by (matched by id or by what it trains)."""
from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.gravac_label import run_section
from ds_gravac_bench.report import SKIP_STEPS, read_steps, smooth
from ds_gravac_bench.systems import jitter_of
from ds_gravac_bench.table_targets import interim_evals


def curve_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Loss (raw and smoothed), per-step times and their median past the first ``SKIP_STEPS``, mean bytes, the
    last value of every ``eval/`` metric and the held-out top-1 at each interim evaluation
    (:func:`ds_gravac_bench.table_targets.interim_evals`)."""
    losses = [float(r["loss"]) for r in records if "loss" in r]
    body = records[SKIP_STEPS:] or records
    times = [float(r["time/step"]) for r in body if r.get("time/step") is not None]
    sent = [float(r["bytes_sent"]) for r in records if r.get("bytes_sent") is not None]
    evals = {k: v for r in records for k, v in r.items() if k.startswith("eval/")}
    top1 = interim_evals([{"step": i + 1, **r} for i, r in enumerate(records)])
    return {"loss": losses, "smoothed": smooth(losses), "times": [float(r.get("time/step") or 0) for r in records],
            "sent": [r.get("bytes_sent") for r in records],
            "median_step": statistics.median(times) if times else None,
            "mean_bytes": statistics.fmean(sent) if sent else None, "eval": evals, "evals": top1}


def load_dir(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    meta = json.loads((path / "meta.json").read_text())
    curves = {sid: {**curve_of(read_steps(path / "systems" / sid / "steps.jsonl")), "family": m.get("family"),
                    "dense_start": int(m.get("dense_start", 0))}
              for sid, m in meta["systems"].items()
              if m.get("returncode", 0) == 0}       # a run that failed or was stopped has no comparable curve
    return meta, curves


SAME_SETTINGS = ("steps", "lr", "micro_batch", "runner_extra")     # what loopback runs merged together must share


def load_dirs(paths: Sequence[Path], same_settings: bool = False
               ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Optional[dict[str, Any]]]]:
    """Systems of several invocations of one model, first occurrence wins. Their dense reference curves must be
    identical (runs are deterministic on one machine), or the merge would compare against different targets. With
    ``same_settings`` (loopback runs made at different times, e.g. one long system per invocation) they must also
    share budget, lr, micro batch and runner options — seed and task included — whether or not each ran dense."""
    meta: dict[str, Any] = {}
    curves: dict[str, dict[str, Any]] = {}
    sections: dict[str, Optional[dict[str, Any]]] = {}
    reference: Optional[list[float]] = None
    for path in paths:
        m, c = load_dir(path)
        if meta and m["model"] != meta["model"]:
            raise SystemExit(f"fidelity: {path} trained {m['model']}, not {meta['model']}")
        differ = [k for k in SAME_SETTINGS if meta and same_settings and m.get(k) != meta.get(k)]
        if differ:
            raise SystemExit(f"fidelity: {path} ran with other {', '.join(differ)} than {paths[0]} "
                             f"({', '.join(f'{m.get(k)} vs {meta.get(k)}' for k in differ)}): not one comparison")
        meta = meta or m
        dense = next((c[sid]["loss"] for sid in ("ds_dense", "gv_dense") if sid in c and c[sid]["loss"]), None)
        if dense is not None and reference is not None:
            n = min(len(dense), len(reference))
            if dense[:n] != reference[:n]:
                raise SystemExit(f"fidelity: the dense loss curve of {path} differs from the first directory's; "
                                 "runs from different machines or settings cannot be merged")
        reference = reference or dense
        for sid, curve in c.items():
            if sid not in curves:
                curves[sid], sections[sid] = curve, run_section(path, sid)
    return meta, curves, sections


def cluster_runs(paths: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """A rate's cluster runs by id, and by the hash of what they train: a loopback system finds its cluster run
    also when that ran the same section under another id (``cfg:…recommended.json`` against ``gv_topk_10``)."""
    _, curves, sections = load_dirs(paths)
    by_section = {match_key(sid, sections[sid]): curve for sid, curve in reversed(list(curves.items()))}
    return {**by_section, **curves}


def as_paths(value: Sequence[Path] | Path) -> list[Path]:
    return [value] if isinstance(value, Path) else list(value)


def match_key(sid: str, section: Optional[dict[str, Any]]) -> str:
    """What a system trains, independent of its id: the same "gravac" section run under two ids (a matrix id and a
    ``cfg:`` file) gets one hash, so runs of several seeds or a cluster run can be matched on it. Systems without a
    section (DeepSpeed's and DDP's own paths) differ in more than a section, so they keep their id."""
    if section is None:
        return f"id:{sid}"
    digest = hashlib.sha1(json.dumps(section, sort_keys=True).encode()).hexdigest()[:12]
    jitter = jitter_of(sid)                 # a noise control trains its section perturbed: another system
    return digest if jitter is None else f"{digest}@jitter={jitter}"
