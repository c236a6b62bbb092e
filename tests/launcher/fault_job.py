"""A 2-rank ds_gravac job in which rank 1 stops responding (SIGSTOP) or dies (SIGKILL) after a given step.

Launched by tests/launcher/test_peer_faults.py under the real ``deepspeed`` launcher (one node, or two ``--no_ssh``
nodes of the emulated cluster). Rank 1 records the wall-clock time just before it signals itself; every surviving
rank records when and with which message its training loop failed, then exits non-zero. A stopped rank 1 starts a
detached watchdog that kills it later, so nothing outlives the test.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import deepspeed
import torch
from torch import nn

import ds_gravac


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["stop", "kill"], required=True)
    parser.add_argument("--at-step", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--markers", required=True, help="directory for the per-rank JSON markers")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser.parse_args()


def write_marker(directory: Path, rank: int, record: dict) -> None:
    path = directory / f"rank{rank}.json"
    path.write_text(json.dumps(record))


def main() -> None:
    args = parse_args()
    markers = Path(args.markers)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 10))     # one tensor > 16,384 elements
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "gravac": {"mode": "static", "compressor": "topk", "cf": 10, "timeout_s": args.timeout_s}}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=config)
    gen = torch.Generator().manual_seed(rank)
    try:
        for step in range(args.steps):
            if rank == 1 and step == args.at_step:
                write_marker(markers, rank, {"fault": args.fault, "time": time.time(), "pid": os.getpid()})
                if args.fault == "stop":
                    subprocess.Popen(["sh", "-c", f"sleep {args.timeout_s + 120}; kill -9 {os.getpid()}"],
                                     start_new_session=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            x = torch.randn(4, 64, generator=gen)
            loss = engine(x).square().mean()
            engine.backward(loss)
            engine.step()
    except Exception as exc:                      # report how and when this rank noticed, then fail
        write_marker(markers, rank, {"time": time.time(), "error": f"{type(exc).__name__}: {exc}"})
        raise
    write_marker(markers, rank, {"time": time.time(), "error": None})


if __name__ == "__main__":
    main()
