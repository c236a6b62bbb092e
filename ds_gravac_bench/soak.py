"""Soak test: thousands of GraVAC steps of a small model; does resident memory grow or the step time drift?

    deepspeed --num_gpus 2 -m ds_gravac_bench.soak --steps 2000 --out soak.json

Every rank samples its resident set size (``VmRSS``) and step time. The report compares RSS at step 100 (after
warm-up: allocator pools and layouts exist by then) with the last step, and the median step time of the first and
the last 10% of the run after step 100. The user never calls ``pop_stats()`` here on purpose: the per-step records
must stay bounded on their own.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import deepspeed
import torch
from torch import nn

import ds_gravac

WARM_STEP = 100


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP (~1M parameters at 1024)")
    parser.add_argument("--out", default=None, help="write the rank-0 report (JSON) here")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser.parse_args()


def summarize(steps: int, times: list[float], rss: dict[int, int]) -> dict:
    late = times[WARM_STEP:]
    tenth = max(1, len(late) // 10)
    first, last = statistics.median(late[:tenth]), statistics.median(late[-tenth:])
    start, end = rss[WARM_STEP], rss[steps]
    return {"steps": steps, "rss_mb_at_100": start / 2**20, "rss_mb_at_end": end / 2**20,
            "rss_growth_pct": 100.0 * (end - start) / start, "rss_mb_max": max(rss.values()) / 2**20,
            "step_ms_first_10pct": 1e3 * first, "step_ms_last_10pct": 1e3 * last,
            "step_time_drift_pct": 100.0 * (last - first) / first}


def main() -> None:
    args = parse_args()
    if args.steps <= WARM_STEP:
        raise SystemExit(f"--steps must be > {WARM_STEP}")
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    window = 100
    config = {"train_micro_batch_size_per_gpu": 16,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}},
              "gravac": {"mode": "gravac", "compressor": "topk",
                         "gravac": {"theta_min": 10, "theta_max": 1000, "window": window, "refresh_steps": 20,
                                    "min_sent_steps": 20, "ewma_alpha": 0.05}}}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=config)
    teacher = nn.Linear(64, 10)
    gen = torch.Generator().manual_seed(rank)
    times: list[float] = []
    rss: dict[int, int] = {}
    levels: dict[int, str] = {}
    handle = ds_gravac.get_handle(engine)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(16, 64, generator=gen)
        loss = nn.functional.cross_entropy(engine(x), teacher(x).argmax(dim=1))
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
        if step == WARM_STEP or step % 100 == 0:
            rss[step] = rss_bytes()
            rec = handle.last_stats()
            levels[step] = f"{rec.get('branch')}@{rec.get('cf_sent', 0):.0f}"
    report = summarize(args.steps, times, rss)
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, report)
    if rank == 0:
        curve = {s: round(1e3 * statistics.median(times[s - 100:s]), 2) for s in range(100, args.steps + 1, 100)}
        result = {"ranks": gathered, "rss_curve_mb": {k: round(v / 2**20, 2) for k, v in rss.items()},
                  "step_ms_median_per_100": curve,
                  "branch_at_cf": levels}
        print("[soak] " + json.dumps(result["ranks"]))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    ds_gravac.detach(engine)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
