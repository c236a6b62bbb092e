"""Can an error budget tell where a low rank is harmless? An offline probe on a long task's dense trajectory.

Low-rank error against rank 16's, as unsent fraction, and against the averaged gradient's sampling noise.

    python -m ds_gravac_bench.noise_probe --task lstm_long --steps 1000 --every 50 --out runs/probe-lstm.json
    python -m ds_gravac_bench.noise_probe --summary docs/bench/long/noise_probe.json runs/probe-*.json

Why: `auto`'s budget is β times rank 16's error, so its quiet plan steps as rank 16 does; rank 4 everywhere trains as
well as rank 16 on `resnet18_long` and ends 7% above dense on `lstm_long` (docs/algorithms.md §8). A budget that
separates the two must order them the other way round from "relative to rank 16": this tool measures three candidate
normalizations of the same error on both tasks.

Two simulated ranks in one process, each with its own shard of the runner's own task (data, model, loss), trained
dense with the task's optimizer settings (SGD, momentum 0.9, the dense config's lr and clipping, the long schedule's
warm-up). Every ``--every`` steps, per compressible matrix (≥ 2 dimensions, ≥ 16,384 elements, viewed as PowerSGD
views it): the averaged gradient's energy ``S = ‖ḡ‖²``, its sampling noise ``N`` (:func:`mean_noise`), and at each
rank r the unsent energy of ``ḡ`` (SVD tail) and the residual in flight ``S·u/(1 − u)`` (error_model). Nothing is
asserted: the ratios are the finding.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ds_gravac.adapt.auto.error_model import residual_in_flight, svd_unsent
from runners.schedule import StepSchedule, from_args

RANKS = (1, 2, 4, 8, 16, 32, 64)
MIN_NUMEL = 16384
PROBED = ("lstm_long", "resnet18_long")
COMMAND = ("python -m ds_gravac_bench.noise_probe --task TASK --steps 1000 --every 50 --out runs/probe-TASK.json, "
           "then --summary (module docstring)")


@dataclass(frozen=True)
class Setting:
    """What the probe trains as the benchmark does: the runner's arguments and the dense config's optimizer."""

    runner_args: tuple[str, ...]
    micro_batch: int
    lr: float
    momentum: float
    weight_decay: float
    clip: float


def setting(name: str) -> Setting:
    """The task as ``ds_gravac_bench.fidelity.TASKS`` runs it: its runner arguments (budget and schedule included)
    and its model's dense config in ds_configs/, the task's lr and micro batch overriding the config's."""
    from ds_gravac_bench.e2e import BASE_CONFIGS, ROOT
    from ds_gravac_bench.fidelity import TASKS

    task = TASKS[name]
    path = ROOT / "ds_configs" / BASE_CONFIGS[task.model]
    cfg = json.loads(path.read_text())
    params = cfg["optimizer"]["params"]
    model = () if task.model == "lstm" else ("--model", task.model)
    return Setting(("--deepspeed_config", str(path), *model, "--steps", str(task.steps), *task.runner_extra),
                   int(task.micro_batch or cfg["train_micro_batch_size_per_gpu"]),
                   float(task.lr if task.lr is not None else params["lr"]), float(params.get("momentum", 0.0)),
                   float(params.get("weight_decay", 0.0)), float(cfg.get("gradient_clipping", 0.0)))


def mean_noise(per_rank: Sequence[torch.Tensor]) -> tuple[float, float]:
    """``(S, N)`` of the mean of n ranks' gradients: ``S = ‖ḡ‖²`` and ``N = (mean_i ‖g_i‖² − S)/(n − 1)``.

    Why this estimator: with ``g_i = G + ε_i`` (independent, covariance Σ), ``E mean_i ‖g_i‖² = ‖G‖² + tr Σ`` and
    ``E ‖ḡ‖² = ‖G‖² + tr Σ / n``, so the difference is ``tr Σ (n − 1)/n`` and ``N`` estimates ``tr Σ / n``, the
    noise the average keeps."""
    _, s, n = _moments(per_rank)
    return s, n


def _moments(per_rank: Sequence[torch.Tensor]) -> tuple[torch.Tensor, float, float]:
    """The float64 mean of the ranks' tensors with :func:`mean_noise`'s ``S`` and ``N``."""
    n = len(per_rank)
    if n < 2:
        raise ValueError("mean_noise needs at least 2 ranks")
    xs = [g.double() for g in per_rank]
    mean = sum(xs) / n
    s = float((mean * mean).sum())
    p = sum(float((x * x).sum()) for x in xs) / n
    return mean, s, (p - s) / (n - 1)


def sample(per_rank: Sequence[Sequence[torch.Tensor]], ranks: Sequence[int] = RANKS,
           min_numel: int = MIN_NUMEL) -> dict[str, Any]:
    """One step's totals over the compressible matrices: ``S``, ``N``, and per rank the unsent energy and the
    residual in flight (summed per matrix)."""
    total_s = total_n = 0.0
    unsent = {r: 0.0 for r in ranks}
    inflight = {r: 0.0 for r in ranks}
    for tensors in zip(*per_rank):
        if tensors[0].dim() < 2 or tensors[0].numel() < min_numel:
            continue
        mean, s, n = _moments(tensors)
        total_s, total_n = total_s + s, total_n + n
        for r, tail in zip(ranks, svd_unsent(mean.reshape(mean.shape[0], -1), ranks)):
            unsent[r] += tail
            inflight[r] += residual_in_flight(tail, s)
    return {"S": total_s, "N": total_n, "unsent": unsent, "inflight": inflight}


class _Forward:
    """What a runner's ``Task.loss`` needs of a system: the module and its forward."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def forward(self, *inputs: Any) -> Any:
        return self.module(*inputs)


def _runner(name: str) -> tuple[Any, Any, Setting]:
    """The runner's task class, its argument parser's result for the task, and the task's setting."""
    from ds_gravac_bench.fidelity import TASKS

    how = setting(name)
    if TASKS[name].model == "lstm":
        from runners.train_ptb import PTBTask as cls, parse_args
    else:
        from runners.train_cifar import CifarTask as cls, parse_args   # type: ignore[assignment]
    return cls, parse_args(list(how.runner_args)), how


def schedule_of(name: str) -> StepSchedule:
    """The task's lr schedule, as its runner builds it from the same arguments."""
    schedule = from_args(_runner(name)[1])
    if schedule is None:
        raise ValueError(f"{name}: the probe needs the long tasks' warm-up schedule")
    return schedule


def _tasks(name: str, world: int) -> tuple[list[Any], Any, Setting]:
    from runners.common import DistInfo

    cls, args, how = _runner(name)
    shards = []
    for rank in range(world):
        task = cls()
        task.check_data(args)
        task.setup(args, DistInfo(rank, world, rank), how.micro_batch, torch.device("cpu"))
        shards.append(task)
    return shards, args, how


def probe(name: str, steps: int, every: int, world: int = 2) -> list[dict[str, Any]]:
    """The dense trajectory's samples at steps ``every, 2·every, …, steps``."""
    shards, args, how = _tasks(name, world)
    schedule = schedule_of(name)
    torch.manual_seed(args.seed)
    model = shards[0].build_model(args)
    model.train()
    forward = _Forward(model)
    opt = torch.optim.SGD(model.parameters(), lr=how.lr, momentum=how.momentum, weight_decay=how.weight_decay)
    rows: list[dict[str, Any]] = []
    for step in range(steps + 1):
        for group in opt.param_groups:
            group["lr"] = how.lr * schedule.factor(step)
        grads, losses = [], []
        for shard in shards:
            model.zero_grad(set_to_none=True)
            loss = shard.loss(forward, shard.micro_batch(step))
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append([p.grad.detach().clone() for p in model.parameters()])
        if step > 0 and step % every == 0:
            rows.append({"step": step, "loss": sum(losses) / world, **sample(grads)})
            print(f"[noise_probe] {name} step {step}: " + ratios_line(rows[-1]), flush=True)
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(gs) / world
        if how.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), how.clip)
        opt.step()
    return rows


def ratios_line(row: dict[str, Any], ranks: Sequence[int] = (4, 8, 16)) -> str:
    s, n = row["S"], row["N"]
    return f"N/S {n / s:.2f} " + " ".join(
        f"r{r}: u {row['unsent'][r] / s:.2f}, M/N {row['inflight'][r] / n:.2f}" for r in ranks)


def summarize(rows: Sequence[dict[str, Any]], after: int, ranks: Sequence[int] = (4, 8, 16)) -> dict[str, Any]:
    """Per rank, over the samples past ``after`` (the warm-up): the unsent fraction u, the residual in flight
    against the noise (M/N) and against rank 16's (M/M16), as mean, min and max (only the count without any)."""
    kept = [r for r in rows if r["step"] > after]
    if not kept:
        return {"samples": 0}                   # a probe shorter than the warm-up: nothing to summarize

    def stats(values: list[float]) -> dict[str, float]:
        return {"mean": round(statistics.fmean(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)}
    out: dict[str, Any] = {"samples": len(kept), "N/S": stats([r["N"] / r["S"] for r in kept])}
    for rank in ranks:
        out[f"r{rank}"] = {
            "u": stats([r["unsent"][rank] / r["S"] for r in kept]),
            "M/N": stats([r["inflight"][rank] / r["N"] for r in kept]),
            "M/M16": stats([r["inflight"][rank] / r["inflight"][16] for r in kept])}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=PROBED)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--out", default=None, help="the samples as JSON")
    p.add_argument("--summary", nargs="+", metavar=("OUT", "SAMPLES"),
                   help="write OUT from earlier --out files: per task, the ratios past its warm-up")
    opts = p.parse_args(argv)
    if opts.summary:
        out, *inputs = opts.summary
        table = {}
        for path in inputs:
            run = json.loads(Path(path).read_text())
            rows = [{**r, "unsent": {int(k): v for k, v in r["unsent"].items()},
                     "inflight": {int(k): v for k, v in r["inflight"].items()}} for r in run["samples"]]
            table[run["task"]] = {"steps": run["steps"], **summarize(rows, schedule_of(run["task"]).warmup)}
        Path(out).write_text(json.dumps({"command": COMMAND, "tasks": table}, indent=1) + "\n")
        print(json.dumps(table, indent=1))
        return
    if not opts.task:
        p.error("--task or --summary is required")
    torch.set_num_threads(1)
    started = time.time()
    rows = probe(opts.task, opts.steps, opts.every)
    print(f"[noise_probe] {opts.task}: {len(rows)} samples in {time.time() - started:.0f} s")
    if opts.out:
        Path(opts.out).write_text(json.dumps({"task": opts.task, "steps": opts.steps, "samples": rows}) + "\n")


if __name__ == "__main__":
    main()
