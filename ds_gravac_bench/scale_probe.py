"""α–β probes of the collectives the exchanges issue, on the emulated cluster, at each N.

The cluster's own ``measure`` times ``dist.all_gather`` into a list of tensors; the exchanges use
``all_gather_into_tensor`` and ``all_to_all_single`` through ``ds_gravac.sync.collectives``. So each rank runs
the cost model's calibration probe itself (``cost_model.calibrate.collective_samples``: one untimed call, then the
median of ``repeats`` calls per size) on the gloo world group, through ``deepspeed.comm`` as in training, inside
its namespace; rank 0 prints the samples. ``scale run`` calls :func:`probe` before the end-to-end runs.

    python -m ds_gravac_bench.scale run --rate 100mbit --ranks 2,3,4 --tag 41 --out runs/scale
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from ds_gravac.sync.cost_model.fits import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL

DEFAULT_BYTES = (256 << 10, 2 << 20, 8 << 20, 24 << 20)
OPS = (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL)


def worker(spec: dict[str, Any]) -> None:
    """One rank: the calibration probe of every op at every size; rank 0 prints ``{op: [[bytes, s], ...]}``."""
    import deepspeed
    import deepspeed.comm as dist
    import torch

    from ds_gravac.sync.cost_model.calibrate import collective_samples

    torch.set_num_threads(1)
    deepspeed.init_distributed("gloo", auto_mpi_discovery=False, init_method=f"tcp://{spec['master']}:{spec['port']}",
                               rank=spec["rank"], world_size=spec["world"])
    channels = SimpleNamespace(world_size=spec["world"], data=None)       # None: the default (world) group
    samples = collective_samples(spec["ops"], spec["bytes"], spec["repeats"], channels)
    dist.barrier()
    dist.destroy_process_group()
    if spec["rank"] == 0:
        print(json.dumps({op: [[x, t] for _, x, t in rows] for op, rows in samples.items()}))


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (other jobs on the machine slow every measured part)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def probe(ranks: Sequence[int], rate: str, tag: int, outdir: Path, sizes: Sequence[int] = DEFAULT_BYTES,
          repeats: int = 3, port: int = 29650) -> dict[str, Any]:
    """Bring a cluster up per N, probe, bring it down; ``{"rate", "n": {N: {op: [[bytes, s], ...]}}, "load"}``."""
    from ds_gravac_bench.cluster import EmulatedCluster

    out: dict[str, Any] = {"rate": rate, "bytes": list(sizes), "repeats": repeats, "n": {}, "load": {}}
    for n in ranks:
        load_before = loadavg()
        t0 = time.monotonic()
        with EmulatedCluster(ranks=n, rate=rate, tag=tag, outdir=outdir / f"cluster-{rate}-n{n}") as cluster:
            spec = {"world": n, "master": cluster.master_addr, "port": port, "ops": list(OPS),
                    "bytes": list(sizes), "repeats": repeats}
            cmds = [[sys.executable, "-m", "ds_gravac_bench.scale_probe", json.dumps({**spec, "rank": i})]
                    for i in range(n)]
            results = cluster.run_all(cmds, f"probe-n{n}", timeout=1200)
            failed = [r for r in results if not r.ok]
            if failed:
                raise RuntimeError(f"scale probe at N={n} failed on rank {failed[0].rank}: "
                                   f"{failed[0].text()[-2000:]}")
            out["n"][str(n)] = json.loads(results[0].stdout.read_text().strip().splitlines()[-1])
        out["load"][str(n)] = {"before": load_before, "after": loadavg(), "seconds": time.monotonic() - t0}
        print(f"[scale probe] {rate} N={n}: {time.monotonic() - t0:.0f} s, load {load_before} -> "
              f"{out['load'][str(n)]['after']}", flush=True)
    return out


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
