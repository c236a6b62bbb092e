"""Rank processes for the device check: ``run(fn, world, backend, device, *args)`` starts ``world`` fresh processes
(spawned: CUDA cannot be used in forked children) with a TCP rendezvous on 127.0.0.1, initializes DeepSpeed's
communication with ``backend`` in each, and returns every rank's result (or its traceback) in rank order."""
from __future__ import annotations

import io
import os
import traceback
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from ds_gravac.integration.ports import free_port


def _entry(rank: int, world: int, port: int, backend: str, device: str, fn: Callable[..., Any], args: tuple,
           queue: Any) -> None:
    # DeepSpeed moves the model to LOCAL_RANK's accelerator: ranks share the GPUs there are; CPU runs ask for CPU
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank % gpus if gpus else rank),
                       "WORLD_SIZE": str(world), "LOCAL_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    if device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        import deepspeed
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
        buf = io.BytesIO()
        torch.save(fn(rank, world, *args), buf)     # bytes, not shared-memory handles: the rank may exit first
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:       # the parent reports it; a rank must never hang the check
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def run(fn: Callable[..., Any], world: int, backend: str, device: str, *args: Any, timeout: float = 600.0
        ) -> list[Any]:
    """``fn(rank, world, device, *args)`` on each rank of ``device`` ("cpu" or "cuda"); a rank that failed gives
    ``{"error": traceback}``."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, backend, device, fn, (device,) + args, queue),
                         daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, status, payload = queue.get(timeout=timeout)
            results[rank] = torch.load(io.BytesIO(payload)) if status == "ok" else {"error": payload}
    except Exception as exc:      # a rank died without reporting, or the timeout passed
        for r in range(world):
            results.setdefault(r, {"error": f"no result: {exc!r}"})
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.terminate()
    return [results[r] for r in range(world)]
