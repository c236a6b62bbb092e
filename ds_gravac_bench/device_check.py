"""``python -m ds_gravac_bench.device_check``: is this device ready for ds_gravac? One JSON report, minutes.

1. Codecs: every registered compressor's encode and decode on the device against its CPU result on the same inputs
   (bitwise where deterministic, ``device_check_codecs.TOLERANCE`` where it draws random numbers), odd sizes, fp32
   and bf16 values; throughput in GB/s and in memory passes against the measured copy bandwidth.
2. Training: a 1-rank engine (NCCL on CUDA, gloo on CPU) trains one compressor of every family (ds_gravac is
   passive with one rank) and a 2-rank group (gloo by default) every compressor, on the device's tensors, for
   ``--steps`` steps; ``mode: "dense"`` must equal DeepSpeed's own path bit for
   bit; the host synchronizations of steady-state steps are counted against ``device_check_syncs.BUDGET`` (on CUDA
   also with ``torch.cuda.set_sync_debug_mode("warn")``).

``--device cpu`` runs the same checks on the device path forced on CPU tensors; ``--tiny`` shrinks sizes and
steps for the CI test. How to run it on a GPU: docs/gpu.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional

import torch

from ds_gravac.compress.registry import registered_names

from . import device_check_codecs as codecs
from .device_check_ranks import run
from .device_check_syncs import BUDGET
from .device_check_train import FAMILIES, MODES, all_names, family_of, job

FIELDS = ("device", "torch", "copy_bandwidth_gb_s", "compressors", "family", "codec", "throughput", "train_1rank",
          "train_2rank", "dense_parity", "modes", "syncs_per_step", "sync_budget", "cuda_syncs_per_step", "passed")


def _sizes(tiny: bool) -> dict[str, Any]:
    if tiny:
        return {"shapes": [(1031,), (67, 53)], "bench": (67, 53), "copy": 1 << 16, "repeats": 1, "steps": 4}
    return {"shapes": [(1_000_003,), (1031, 517)], "bench": (2053, 2049), "copy": 1 << 26, "repeats": 5,
            "steps": 20}


def _train_summary(rank_results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    rows = [r.get(name, r) for r in rank_results]
    errors = [row["error"] for row in rows if "error" in row]
    if errors:
        return {"error": errors[0].strip().splitlines()[-1], "passed": False}
    syncs = max(row["syncs_per_step"] for row in rows)
    finite = all(torch.isfinite(torch.tensor(row["losses"])).all() for row in rows)
    replicas = all(all(torch.equal(rows[0]["params"][k], row["params"][k]) for k in row["params"]) for row in rows)
    cuda = [row.get("cuda_syncs_per_step") for row in rows if row.get("cuda_syncs_per_step") is not None]
    return {"steps": len(rows[0]["losses"]), "final_loss": rows[0]["losses"][-1], "finite": finite,
            "replicas_identical": replicas, "branch": rows[0]["branch"], "syncs_per_step": syncs,
            "sync_budget": BUDGET.get(name), "cuda_syncs_per_step": max(cuda) if cuda else None,
            "sync_sites": rows[0]["sync_sites"], "passed": finite and replicas and syncs <= BUDGET.get(name, 0)}


def _parity(rank_results: list[dict[str, Any]]) -> Optional[bool]:
    try:
        return all(all(torch.equal(r["deepspeed"]["params"][k], r["dense"]["params"][k])
                       for k in r["deepspeed"]["params"]) for r in rank_results)
    except (KeyError, TypeError):
        return None


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tiny", action="store_true", help="small sizes and 4 steps (the CI test)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per compressor (default 20)")
    ap.add_argument("--backend-2rank", default="gloo", help="backend of the 2-rank group (gloo; nccl needs 2 GPUs)")
    ap.add_argument("--out", default=None, help="write the JSON report here (also printed)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    size = _sizes(args.tiny)
    steps = args.steps or size["steps"]
    device = torch.device(args.device)
    bandwidth = codecs.copy_bandwidth(device, size["copy"], size["repeats"])
    names = registered_names()
    report: dict[str, Any] = {"device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
                              "torch": torch.__version__, "fields": list(FIELDS),
                              "copy_bandwidth_gb_s": bandwidth / 1e9, "compressors": {}}
    for name in names:
        entry: dict[str, Any] = {"family": family_of(name)}
        try:
            entry["codec"] = codecs.compare(name, device, size["shapes"])
            entry["throughput"] = codecs.throughput(name, device, size["bench"], bandwidth, size["repeats"])
        except Exception as exc:          # a compressor that cannot run here is a failed row, not a crash
            entry["codec"] = {"error": f"{type(exc).__name__}: {exc}", "passed": False}
        report["compressors"][name] = entry
    phases = {"codecs_s": time.perf_counter() - t0}
    count_from = max(2, steps - 2)        # steady state: after the discovery step and the first compressed one
    # one rank: ds_gravac stays passive (nothing to communicate), so one compressor per family shows the attach
    one_names = {family: next(iter(members)) for family, members in FAMILIES.items()}
    one = run(job, 1, "nccl" if device.type == "cuda" else "gloo", args.device, list(one_names.values()), steps,
              count_from)
    phases["train_1rank_s"] = time.perf_counter() - t0 - phases["codecs_s"]
    two = run(job, 2, args.backend_2rank, args.device, all_names(), steps, count_from)
    phases["train_2rank_s"] = time.perf_counter() - t0 - phases["codecs_s"] - phases["train_1rank_s"]
    report["train_1rank"] = {family: {"compressor": name, **_train_summary(one, name)}
                             for family, name in one_names.items()}
    for name in names:
        report["compressors"][name]["train_2rank"] = _train_summary(two, name)
    report["dense_parity"] = {"1rank": _parity(one), "2rank": _parity(two)}
    report["modes"] = {mode: _train_summary(two, mode) for mode in MODES}
    report["passed"] = bool(report["dense_parity"]["1rank"] and report["dense_parity"]["2rank"]) and all(
        e["codec"].get("passed") and e["train_2rank"]["passed"] for e in report["compressors"].values()) and all(
        t["passed"] for t in (*report["modes"].values(), *report["train_1rank"].values()))
    report["seconds"] = time.perf_counter() - t0
    report["phases"] = phases
    text = json.dumps(report, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
