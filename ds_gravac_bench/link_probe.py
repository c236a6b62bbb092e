"""The link probe the emulated cluster runs inside each namespace: times gloo collectives between the ranks and
fits ``t = A + B·bytes`` per collective (``EmulatedCluster.measure`` starts one per rank).

    python -m ds_gravac_bench.link_probe '{"rank": 0, "world": 2, "master": "10.77.0.1", "port": 29600, ...}'
"""
from __future__ import annotations

import json
import statistics
import sys
import time


# -- -----------------------------------------------------------------
def wire_factor(op: str, world: int) -> float:
    """Bytes each rank sends per byte of its input tensor: ring all-reduce 2(N-1)/N, all-gather N-1, all-to-all (N-1)/N."""
    return {"all_reduce": 2 * (world - 1) / world, "all_gather": world - 1.0, "all_to_all": (world - 1) / world}[op]


def fit_line(xs: list[float], ts: list[float]) -> tuple[float, float]:
    """``t = A + B·x`` minimising the *relative* squared error (weights 1/t²), so small sizes fix A."""
    w = [1 / t**2 for t in ts]
    sw, sx, st = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * t for wi, t in zip(w, ts))
    sxx, sxt = sum(wi * x * x for wi, x in zip(w, xs)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = sw * sxx - sx * sx
    if len(xs) < 2 or det == 0:
        return 0.0, ts[0] / xs[0]
    b = (sw * sxt - sx * st) / det
    return (st - b * sx) / sw, b


def _collective(op: str, size: int, world: int):
    import torch
    import torch.distributed as dist
    n = max(world, size // 4 // world * world)                       # float32 elements, divisible by world
    x = torch.ones(n)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "all_gather":
        outs = [torch.empty(n) for _ in range(world)]
        return lambda: dist.all_gather(outs, x)
    out = torch.empty(n)
    return lambda: dist.all_to_all_single(out, x)


def measure_worker(rank: int, world: int, master: str, port: int, sizes: list[int], ops: list[str],
                   max_repeats: int, burst: int = 0) -> None:
    """Median time per op and size (each after a barrier); rank 0 prints one JSON line.

    The fit uses only sizes whose wire bytes exceed the tbf ``burst`` (smaller ones pass at veth speed).
    """
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    report: dict = {"sizes": sizes, "ops": {}}
    for op in ops:
        _collective(op, sizes[0], world)()                            # warm-up: connections, allocator
        seconds = []
        for size in sizes:
            fn, times = _collective(op, size, world), []
            for _ in range(max(1, min(max_repeats, (16 << 20) // size))):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            seconds.append(statistics.median(times))
        factor = wire_factor(op, world)
        shaped = [(s, t) for s, t in zip(sizes, seconds) if factor * s > burst]
        a, b = fit_line(*zip(*(shaped if len(shaped) >= 2 else zip(sizes, seconds))))
        report["ops"][op] = {"seconds": seconds, "mbit_s": [factor * s * 8 / t / 1e6 for s, t in zip(sizes, seconds)],
                             "fit": {"A_s": a, "B_s_per_byte": b, "mbit_s": factor * 8 / b / 1e6 if b > 0 else None}}
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(report))


if __name__ == "__main__":
    measure_worker(**json.loads(sys.argv[1]))
