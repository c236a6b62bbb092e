"""Smallest real ds_gravac job: a 2-rank `deepspeed` run of a small MLP on a learnable synthetic task.

    deepspeed --num_gpus 2 runners/minimal_example.py --deepspeed_config ds_configs/minimal_topk.json --steps 60

Prints, on rank 0, a summary: loss at start and end, the CF and branch timeline, and bytes sent vs dense.
"""
from __future__ import annotations

import argparse
import collections
import os

import deepspeed
import torch
from torch import nn

import ds_gravac


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(args.seed)
    teacher = nn.Linear(64, 10)       # the learnable target: labels from a fixed random linear teacher
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    engine, *_ = ds_gravac.initialize(args=args, model=model, model_parameters=model.parameters())
    handle = ds_gravac.get_handle(engine)
    gen = torch.Generator().manual_seed(1000 + rank)
    losses, records = [], []
    for _ in range(args.steps):
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 64, generator=gen)
        y = teacher(x).argmax(dim=1)
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        records.extend(handle.pop_stats())
    if rank == 0:
        summarize(losses, records)
    # End together and shut the groups down before interpreter exit: a rank that tears gloo down on its own
    # while its peer is still connected can abort ("terminate called without an active exception").
    ds_gravac.detach(engine)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def summarize(losses: list[float], records: list[dict]) -> None:
    sent = sum(r["bytes_sent"] for r in records)
    dense = sum(r["dense_bytes"] for r in records)
    timeline = collections.Counter((r["branch"], round(r["cf_sent"], 2)) for r in records)
    head, tail = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"ds_gravac summary: {len(records)} optimizer steps, loss {head:.3f} -> {tail:.3f}")
    print("  branch/CF timeline: " + ", ".join(f"{b}@{cf:g}x: {n} steps" for (b, cf), n in sorted(timeline.items())))
    print(f"  bytes sent {sent / 1e6:.2f} MB vs dense {dense / 1e6:.2f} MB ({dense / max(sent, 1):.1f}x less)")


if __name__ == "__main__":
    main()
