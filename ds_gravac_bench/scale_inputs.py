"""The scale tool's compact input: what the model needs from measured runs, small enough to keep in the repository.

``collect`` reads end-to-end runs (``ds_gravac_bench.e2e`` output directories, one per N at one rate), the
collective probes of the same rate (``scale_probe``) and the model's bucket workloads (``scale_workload``), and
keeps per N and system the medians of the step records (the first two steps left out, as the e2e report does),
the machine load around the run, and per N and op the probe samples. No raw run and no absolute path is kept.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .report import SKIP_STEPS, read_steps

RECORD_KEYS = {"step_s": "time/step", "compute_s": "time/compute_est", "codec_s": "time/codec",
               "stage_s": "stage_s", "compress_s": "compress_s", "decompress_s": "decompress_s",
               "writeback_s": "writeback_s", "comm_wait_s": "comm_wait_s", "bytes_sent": "bytes_sent"}
FORMAT = "ds_gravac-scale-input/1"
COMPUTE_ID = "compute_only_engine"


def medians(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians of the record keys over the steps after the first two; also p10/p90 of the step."""
    body = list(records[SKIP_STEPS:]) or list(records)
    out: dict[str, Any] = {"steps": len(records)}
    for short, key in RECORD_KEYS.items():
        vals = [float(r[key]) for r in body if r.get(key) is not None]
        if vals:
            out[short] = statistics.median(vals)
    steps = sorted(float(r["time/step"]) for r in body if r.get("time/step") is not None)
    if steps:
        out["step_p10_s"], out["step_p90_s"] = steps[int(0.1 * (len(steps) - 1))], steps[int(0.9 * (len(steps) - 1))]
    return out


def run_records(run_dir: Path, systems: Sequence[str]) -> dict[str, Any]:
    """Medians per system of one e2e run directory (systems without records are left out)."""
    out = {}
    for sid in systems:
        recs = read_steps(run_dir / "systems" / sid / "steps.jsonl")
        if recs:
            out[sid] = medians(recs)
    return out


def run_load(run_dir: Path) -> Optional[Any]:
    """The load the run recorded next to it (``load.json`` written by ``scale run``), if any."""
    for path in (run_dir / "load.json", run_dir.parent / "load.json"):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def compute_only(run_dir: Path) -> Optional[dict[str, Any]]:
    """The compute-only step of an invocation (``compute_only_engine``: one single-rank process per rank, each
    through a DeepSpeed engine with its all-reduce off, pinned as the cluster's ranks are), with its load."""
    recs = run_records(run_dir, [COMPUTE_ID]).get(COMPUTE_ID)
    return None if recs is None else {**recs, "load": run_load(run_dir)}


def collect(model: str, rate: str, sections: Mapping[str, Optional[dict[str, Any]]], runs: Mapping[int, Path],
            probes: Mapping[str, Any], ns: Sequence[int], cores: int,
            compute_runs: Optional[Mapping[int, Path]] = None) -> dict[str, Any]:
    """The compact input (see the module docstring); ``cores``: cores the cluster runs had (oversubscription);
    ``compute_runs``: invocations holding the compute-only step of an N (default: the run of that N)."""
    from .scale_workload import profile, workloads

    systems = list(sections)
    compute_runs = {**runs, **(compute_runs or {})}
    return {"format": FORMAT, "model": model, "rate": rate, "cores": cores, "systems": systems,
            "sections": {sid: sec for sid, sec in sections.items()},
            "workloads": workloads(model, dict(sections), sorted(set(ns) | set(runs))),
            "backward_share": profile(model).share,
            "measured": {str(n): {"records": run_records(Path(d), systems), "load": run_load(Path(d)),
                                  "compute_only": compute_only(Path(compute_runs[n]))}
                         for n, d in sorted(runs.items())},
            "probes": probes}


def probes_from_measure(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Probes in the scale format from the cluster's own ``measure`` reports (one per N; its all-gather fills a
    list of tensors, where the exchanges gather into one tensor)."""
    rates = {r["rate"] for r in reports}
    if len(rates) != 1:
        raise ValueError(f"scale: measure reports of several rates {sorted(rates)}")
    return {"rate": rates.pop(), "source": "cluster measure",
            "n": {str(r["ranks"]): {op: [[float(x), float(t)] for x, t in zip(r["sizes"], v["seconds"])]
                                    for op, v in r["ops"].items()} for r in reports}}


def read_probes(paths: Sequence[Path]) -> dict[str, Any]:
    """One ``scale probe`` file, or the cluster ``measure`` reports of several N."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    if len(docs) == 1 and "n" in docs[0]:
        return docs[0]
    if all("ops" in d and "ranks" in d for d in docs):
        return probes_from_measure(docs)
    raise ValueError("scale: --probes takes one `scale probe` file or the cluster `measure` reports of each N")


def load_input(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"scale: {path} is not a scale input (format {data.get('format')!r}, expected {FORMAT})")
    return data
