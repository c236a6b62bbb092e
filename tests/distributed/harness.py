"""Real multi-process gloo groups for tests: torch.multiprocessing with a TCP rendezvous on 127.0.0.1.

Each rank initialises ``deepspeed.comm`` exactly as the ``deepspeed`` launcher's children do (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT in the environment), runs ``fn(rank, world_size, *args)`` and returns its result
(picklable) to the parent. A rank that raises makes ``run_ranks`` raise with that rank's traceback.

Ranks are fresh processes forked from a fork server that imported torch, DeepSpeed and ds_gravac once: every test
still gets new processes with nothing left over from another test, without paying ~3 s of imports per rank group
(about a third of the distributed suite's time on a 2-core machine). It imports ``torch._dynamo`` too: every
optimizer's first ``add_param_group`` imports it (``torch._disable_dynamo``), 2.2 s of CPU per rank, which halved
the distributed suite's time once preloaded. The server only imports; it never runs an
operator or a collective, so no thread pool or socket is inherited across the fork.
"""
from __future__ import annotations

import functools
import io
import os
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from ds_gravac.integration.ports import free_port
from ds_gravac.integration.shm_buffer import buffer_path


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"})
    try:
        import torch
        torch.set_num_threads(1)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        result = fn(rank, world_size, *args)
        buf = io.BytesIO()
        torch.save(result, buf)   # bytes, not shared-memory handles: the rank may exit before the parent reads
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:  # report every failure to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


PRELOADED = ["torch", "torch._dynamo", "deepspeed", "ds_gravac", "harness"]


@functools.cache
def rank_context() -> Any:
    """The fork-server context (started on first use, kept for the session); ranks get a CPU DeepSpeed. The two
    defaults are set in this process because the server, started from it, passes its environment to every rank."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")   # read when the server imports DeepSpeed
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOADED)
    return ctx


RENDEZVOUS_ATTEMPTS = 3


def run_ranks(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 480.0) -> list[Any]:
    """Run ``fn`` on ``world_size`` gloo ranks; returns results ordered by rank. A rendezvous port taken between
    ``free_port`` and rank 0's listen (another worker's connection can get it: EADDRINUSE before ``fn`` ran) is
    retried on a new port; any other failure is raised."""
    for attempt in range(RENDEZVOUS_ATTEMPTS):
        try:
            return _run_ranks_once(fn, world_size, args, timeout)
        except RuntimeError as exc:
            if "EADDRINUSE" not in str(exc) or attempt == RENDEZVOUS_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _run_ranks_once(fn: Callable[..., Any], world_size: int, args: tuple, timeout: float) -> list[Any]:
    ctx = rank_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, fn, args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world_size):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "ok":
                import torch
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            else:
                errors.append(f"rank {rank}:\n{payload}")
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 1)
            if p.is_alive():
                p.kill()
        remove_shm_buffers(port, world_size)
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def remove_shm_buffers(port: int, world_size: int) -> None:
    """DeepSpeed's CPU comm op leaks a ~69 MB /dev/shm buffer per rank and port (ds_gravac/integration/shm_buffer.py);
    ranks that never reached ``attach`` (error tests) leave theirs behind, so the harness removes them."""
    for rank in range(world_size):
        buffer_path("127.0.0.1", port, rank).unlink(missing_ok=True)
