"""The one training loop every system runs, plus evaluation and
checkpoint/resume. Runners supply a :class:`Task` (data, model, loss, eval); nothing here knows CIFAR or PTB.

Data position is the micro-batch index: tasks map it deterministically to this rank's batch, so saving that
index (and the per-rank RNG and task state) is all a resume needs to continue the uninterrupted stream.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from .common import (DistInfo, RunnerError, check_monitors, configure_process, init_distributed, load_ds_config,
                     micro_batch_size, rank_seed, rng_state, seed_all, set_rng_state, without_gravac)
from .logging_utils import MetricsLogger, sync_fields
from .systems import System, build_system

AllSum = Callable[[torch.Tensor], torch.Tensor]


class Task:
    """A runner's data, model, loss and evaluation. ``micro_batch(i)`` must be a pure function of ``i`` (and
    the task's own ``state_dict``), so the stream can be resumed exactly."""

    name = "task"
    samples_per_micro_batch = 0          # set in setup(): images or sequences per micro-batch on one rank
    tokens_per_micro_batch: Optional[int] = None

    def check_data(self, args: argparse.Namespace) -> None:
        """Fail fast, before any distributed work, when local data files are missing."""

    def setup(self, args: argparse.Namespace, dist: DistInfo, micro_batch: int, device: torch.device) -> None:
        raise NotImplementedError

    def build_model(self, args: argparse.Namespace) -> nn.Module:
        raise NotImplementedError

    def micro_batch(self, index: int) -> Any:
        raise NotImplementedError

    def loss(self, system: System, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(self, module: nn.Module, max_batches: int, all_sum: AllSum) -> dict[str, float]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


@dataclass
class LoopState:
    micro_index: int = 0
    last_eval: int = -1
    last_save: int = -1


def all_sum(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as tdist

    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(t)
    return t


def main(task: Task, parse: Callable[[], argparse.Namespace]) -> None:
    """Entry point of a runner: user-facing problems print one clear line and exit with status 2."""
    args = parse()
    try:
        run(task, args)
    except RunnerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


def run(task: Task, args: argparse.Namespace) -> None:
    configure_process(args)
    cfg = load_ds_config(args.deepspeed_config, args.micro_batch)
    check_monitors(cfg, runner_wandb=not args.no_wandb)
    task.check_data(args)
    dist = init_distributed()
    system = _build(task, args, cfg, dist)
    seed_all(rank_seed(args.seed, dist.rank))
    state = LoopState()
    if args.resume:
        state = resume(system, task, args, dist)
    logger = MetricsLogger(args, dist.is_main, without_gravac(cfg) if args.system != "gravac" else cfg,
                           start_step=system.global_steps, resumed=bool(args.resume))
    logger.info(f"{task.name}: system {system.name}, {dist.world_size} ranks, micro batch "
                f"{task.samples_per_micro_batch}, gradient_clipping {system.gradient_clipping():g}"
                + (f", resumed at step {system.global_steps}" if args.resume else ""))
    train(task, system, args, dist, state, logger)
    logger.finish(f"{task.name} summary: system {system.name}, model {args.model}, {dist.world_size} ranks, "
                  f"config {os.path.basename(args.deepspeed_config)}", system.gradient_clipping())
    shutdown(system)


def shutdown(system: System) -> None:
    """End together and close the process group before interpreter exit: a rank that tears gloo down on its own
    while its peer is still connected can abort ("terminate called without an active exception", seen in CI
    after a run had finished all its steps)."""
    import torch.distributed as tdist

    system.close()
    if tdist.is_initialized():
        tdist.barrier()
        tdist.destroy_process_group()


def _build(task: Task, args: argparse.Namespace, cfg: dict[str, Any], dist: DistInfo) -> System:
    """Same seed on every rank before the model exists: every system starts from the same weights."""
    from .common import device

    task.setup(args, dist, micro_batch_size(cfg, dist.world_size), device())
    seed_all(args.seed)
    model = task.build_model(args)
    return build_system(args, cfg, model, dist)


def train(task: Task, system: System, args: argparse.Namespace, dist: DistInfo, state: LoopState,
          logger: MetricsLogger) -> None:
    system.set_train(True)
    t_prev = time.perf_counter()
    while system.global_steps < args.steps:
        losses = _optimizer_step(task, system, state)
        step_time = time.perf_counter() - t_prev
        record = step_record(task, system, dist, losses, step_time)
        step, last = system.global_steps, system.global_steps >= args.steps
        if args.eval_every >= 0 and (last or (args.eval_every > 0 and step % args.eval_every == 0)):
            record.update(evaluate(task, system, args, state, logger, final=last))
        logger.log_step(record)
        logger.log_events(system.pop_events())
        if args.save_dir and (last or (args.save_every > 0 and step % args.save_every == 0)):
            save(system, task, args, dist, state)
        t_prev = time.perf_counter()          # eval and checkpoint time is not step time
    if args.eval_every >= 0 and state.last_eval != system.global_steps:   # resumed at or past --steps
        evaluate(task, system, args, state, logger, final=True)


def _optimizer_step(task: Task, system: System, state: LoopState) -> list[float]:
    """Micro-batches until the system completes one optimizer step (gradient accumulation included)."""
    start, losses = system.global_steps, []
    while system.global_steps == start:
        batch = task.micro_batch(state.micro_index)
        with system.sync_context():
            loss = task.loss(system, batch)
            system.backward(loss)
        system.step()
        state.micro_index += 1
        losses.append(float(loss.detach()))
    return losses


def step_record(task: Task, system: System, dist: DistInfo, losses: list[float], step_time: float
                ) -> dict[str, Any]:
    """Loss is rank 0's own (no extra collective in the timed path); rates count all ranks."""
    samples = dist.world_size * task.samples_per_micro_batch * len(losses)
    rec: dict[str, Any] = {"step": system.global_steps, "system": system.name, "loss": sum(losses) / len(losses),
                           "lr": system.lr(), "time/step": step_time, "samples_per_s": samples / step_time,
                           "mem/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if task.tokens_per_micro_batch:
        rec["tokens_per_s"] = dist.world_size * task.tokens_per_micro_batch * len(losses) / step_time
    logical = system.logical_bytes()
    if logical is not None:
        sent, dense = logical
        rec.update({"bytes_sent": sent, "dense_bytes": dense, "comm/bytes_sent": sent,
                    "comm/bytes_dense_equiv": dense})
    rec.update(sync_fields(system.pop_records(), step_time))
    return rec


def evaluate(task: Task, system: System, args: argparse.Namespace, state: LoopState,
             logger: MetricsLogger, final: bool = False) -> dict[str, float]:
    """Held-out metrics on ``--eval-batches`` per rank, on ``--final-eval-batches`` after the last step."""
    final_batches = getattr(args, "final_eval_batches", None)
    batches = final_batches if final and final_batches is not None else args.eval_batches
    system.set_train(False)
    with torch.no_grad():
        metrics = task.evaluate(system.module, batches, all_sum)
    system.set_train(True)
    metrics = {f"eval/{k}": v for k, v in metrics.items()}
    state.last_eval = system.global_steps
    logger.log_eval(system.global_steps, metrics)
    logger.info(f"step {system.global_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics


# ---- checkpoints ---------------------------------------------------------------------------------------


def runner_file(tag_dir: str, rank: int) -> str:
    return os.path.join(tag_dir, f"runner_rank{rank:05d}.pt")


def save(system: System, task: Task, args: argparse.Namespace, dist: DistInfo, state: LoopState) -> None:
    """The system's checkpoint (ds_gravac's includes per-rank residuals) with the data position in
    client_state, then one per-rank file with RNG and task state (e.g. the LSTM hidden state)."""
    import torch.distributed as tdist

    step = system.global_steps
    tag = f"step{step}"
    client = {"runner": {"micro_index": state.micro_index, "global_steps": step, "world_size": dist.world_size,
                         "micro_batch": task.samples_per_micro_batch, "seed": args.seed, "system": args.system,
                         "task": task.name}}
    system.save(args.save_dir, tag, client)
    tag_dir = os.path.join(args.save_dir, tag)
    os.makedirs(tag_dir, exist_ok=True)
    payload = {"rng": rng_state(), "task": task.state_dict(), "system": system.local_state()}
    path = runner_file(tag_dir, dist.rank)
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)
    tdist.barrier()
    state.last_save = step


def _dry_run(task: Task, system: System) -> None:
    with system.sync_context():
        system.backward(task.loss(system, task.micro_batch(0)))


def resume(system: System, task: Task, args: argparse.Namespace, dist: DistInfo) -> LoopState:
    """Weights, optimizer and schedule from the system's checkpoint; data position from client_state; RNG and
    task state (LSTM hidden) from this rank's runner file."""
    system.before_resume(lambda: _dry_run(task, system))
    load_path, client = system.load(args.resume)
    if load_path is None:
        raise RunnerError(f"--resume {args.resume}: no checkpoint found there")
    runner = client.get("runner")
    if runner is None:
        raise RunnerError(f"--resume {args.resume}: the checkpoint has no runner state (not written by a runner)")
    for key, now in (("world_size", dist.world_size), ("micro_batch", task.samples_per_micro_batch),
                     ("seed", args.seed), ("system", args.system)):
        if runner.get(key) != now and dist.is_main:
            print(f"warning: resuming with {key}={now!r}, checkpoint has {runner.get(key)!r}: the data stream "
                  f"or the state differs from an uninterrupted run", file=sys.stderr, flush=True)
    tag_dir = os.path.dirname(load_path) if os.path.isfile(load_path) else load_path
    path = runner_file(tag_dir, dist.rank)
    if os.path.isfile(path):
        local = torch.load(path, map_location="cpu", weights_only=False)
        set_rng_state(local["rng"])
        task.load_state_dict(local.get("task", {}))
        system.load_local_state(local.get("system", {}))
    else:
        task.load_state_dict({})
        if dist.is_main:
            print(f"warning: {path} missing: RNG and task state start fresh", file=sys.stderr, flush=True)
    return LoopState(micro_index=int(runner["micro_index"]), last_save=system.global_steps)
