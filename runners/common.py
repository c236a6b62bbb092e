"""Shared runner plumbing: command line, process set-up, seeding, DeepSpeed config.

Every runner (``train_cifar.py``, ``train_ptb.py``) builds its parser here, adds its own options, and hands a
task to :func:`runners.loop.run`; engines and DDP wrappers come from :mod:`runners.systems`. Keeping these in
one place is what makes the systems comparable: the same arguments, seeds, data order and optimizer settings
reach every system.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .grad_jitter import MAX_REL as MAX_JITTER
from .schedule import parse_fractions

SYSTEMS = ("gravac", "deepspeed", "ddp", "ddp_powersgd", "ddp_bf16", "ddp_localsgd", "local", "local_engine")


class RunnerError(RuntimeError):
    """A user-facing problem (missing data, conflicting settings): printed without a traceback."""


# ---- command line ---------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Every ``--multi-word`` option also answers to ``--multi_word``: the spelling
    DeepSpeed's own options (``--local_rank``, ``--deepspeed_config``) use."""

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        extra = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
        extra = [n for n in extra if n not in names]
        return super().add_argument(*names, *extra, **kwargs)


def base_parser(description: str) -> argparse.ArgumentParser:
    """Options every runner shares; runners add theirs, then call :func:`finish_parser`."""
    p = _Parser(description=description)
    p.add_argument("--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)),
                   help="set by the deepspeed launcher; torchrun passes LOCAL_RANK in the environment")
    p.add_argument("--system", choices=SYSTEMS, default="gravac",
                   help="gravac: ds_gravac.initialize; deepspeed: deepspeed.initialize on the same config without "
                        "its 'gravac' section; ddp / ddp_powersgd / ddp_bf16 / ddp_localsgd: torch DDP (gloo, 25 MB "
                        "buckets) plain or with torch's PowerSGD, bf16 or post-local SGD scheme, optimizer and "
                        "LR schedule from the config; local: one rank, no communication (compute-only step)")
    p.add_argument("--powersgd-rank", type=int, default=4,
                   help="ddp_powersgd: matrix_approximation_rank of torch's powerSGD_hook (docs/BENCHMARKS.md: 4; also 1)")
    p.add_argument("--localsgd-period", type=int, default=8,
                   help="ddp_localsgd: steps between two parameter averages (PeriodicModelAverager's period)")
    p.add_argument("--localsgd-start", type=int, default=0,
                   help="ddp_localsgd: gradients are all-reduced for this many steps before local SGD starts")
    p.add_argument("--grad-jitter", type=float, default=0.0, metavar="REL",
                   help="deepspeed / gravac: multiply every averaged gradient by 1 + REL*N(0,1) before the optimizer "
                        "step, the same on every rank (a benchmark control: the noise floor of a per-seed loss gap; "
                        "runners/grad_jitter.py); 0 = off, at most 0.1")
    p.add_argument("--steps", type=int, default=100, help="train until this many optimizer steps (also on resume)")
    p.add_argument("--lr-warmup", type=int, default=0, metavar="STEPS",
                   help="linear learning-rate warm-up over this many optimizer steps (runners/schedule.py; replaces "
                        "the config's 'scheduler' section)")
    p.add_argument("--lr-decay-at", type=parse_fractions, default=(), metavar="FRACTIONS",
                   help="multiply the learning rate by --lr-decay-gamma at these fractions of --steps, e.g. "
                        "0.5,0.75 (replaces the config's 'scheduler' section)")
    p.add_argument("--lr-decay-gamma", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--micro-batch", type=int, default=None,
                   help="override train_micro_batch_size_per_gpu of the config (train_batch_size is re-derived)")
    p.add_argument("--data-dir", default="data", help="directory with local dataset files")
    p.add_argument("--download", action="store_true", help="allow downloading CIFAR (never done otherwise)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N optimizer steps (0: only after the last step; -1: never)")
    p.add_argument("--eval-batches", type=int, default=20, help="evaluation batches per rank (0: whole split)")
    p.add_argument("--final-eval-batches", type=int, default=None,
                   help="evaluation batches per rank after the last step (0: whole split; default --eval-batches): "
                        "a final metric finer than the periodic ones")
    p.add_argument("--save-dir", default=None, help="write checkpoints here (tags step<N>)")
    p.add_argument("--save-every", type=int, default=0,
                   help="checkpoint every N optimizer steps (0: only after the last step); needs --save-dir")
    p.add_argument("--resume", default=None, metavar="SAVE_DIR",
                   help="resume from the latest checkpoint in SAVE_DIR and continue the same data stream")
    p.add_argument("--no-wandb", action="store_true", help="do not create a wandb run (steps.jsonl is kept)")
    p.add_argument("--wandb-project", default="ds_gravac")
    p.add_argument("--run-name", default=None, help="default: <model>-<system>-<config>-s<seed>-<time>")
    p.add_argument("--log-dir", default=None, help="steps.jsonl and the wandb directory (default runs/<run-name>)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument("--compare-to", default=None, metavar="STEPS_JSONL",
                   help="another run's steps.jsonl (e.g. the dense run's): the summary prints both smoothed losses "
                        "at this run's last step")
    return p


def finish_parser(parser: argparse.ArgumentParser, argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Add DeepSpeed's own options (``--deepspeed_config``) and parse; fills derived defaults."""
    import deepspeed

    args = deepspeed.add_config_arguments(parser).parse_args(argv)
    if not args.deepspeed_config:
        parser.error("--deepspeed_config is required (the single source of batch, optimizer and schedule)")
    if args.save_every and not args.save_dir:
        parser.error("--save-every needs --save-dir")
    if not 0.0 <= args.grad_jitter <= MAX_JITTER:
        parser.error(f"--grad-jitter must be in [0, {MAX_JITTER}], got {args.grad_jitter}")
    if args.grad_jitter and args.system not in ("deepspeed", "gravac"):
        parser.error(f"--grad-jitter applies to --system deepspeed or gravac, not {args.system}")
    for flag, value in (("--eval-batches", args.eval_batches), ("--final-eval-batches", args.final_eval_batches)):
        if value is not None and value < 0:
            parser.error(f"{flag} must be >= 0 (0: the whole held-out split), got {value}")
    if args.lr_warmup < 0:      # a warm-up past --steps is allowed (a shortened run of a long task)
        parser.error(f"--lr-warmup must be >= 0, got {args.lr_warmup}")
    if not 0.0 < args.lr_decay_gamma <= 1.0:
        parser.error(f"--lr-decay-gamma must be in (0, 1], got {args.lr_decay_gamma}")
    if args.localsgd_period < 1 or args.localsgd_start < 0:
        parser.error(f"--localsgd-period must be >= 1 and --localsgd-start >= 0, got {args.localsgd_period} and "
                     f"{args.localsgd_start}")
    if args.powersgd_rank < 1:
        parser.error(f"--powersgd-rank must be >= 1, got {args.powersgd_rank}")
    if args.run_name is None:
        stem = os.path.splitext(os.path.basename(args.deepspeed_config))[0]
        args.run_name = f"{args.model}-{args.system}-{stem}-s{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.log_dir is None:
        args.log_dir = os.path.join("runs", args.run_name)
    return args


# ---- process set-up -------------------------------------------------------------------------------------


def configure_process(args: argparse.Namespace) -> None:
    """Threads from OMP_NUM_THREADS (the launcher leaves it unset: every rank would use every core), and the
    wandb environment: offline unless told otherwise, everything under the log dir."""
    threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    torch.set_num_threads(max(1, threads))
    log_dir = os.path.abspath(args.log_dir)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ["WANDB_DIR"] = log_dir
    os.environ.setdefault("WANDB_CACHE_DIR", os.path.join(log_dir, "wandb-cache"))
    os.environ.setdefault("WANDB_CONFIG_DIR", os.path.join(log_dir, "wandb-config"))
    os.environ.setdefault("WANDB_DATA_DIR", os.path.join(log_dir, "wandb-data"))
    os.environ.setdefault("WANDB_SILENT", "true")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """gloo on CPU, NCCL/… on accelerators: the backend comes from DeepSpeed's accelerator, not from us."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name(), verbose=False)
    import torch.distributed as dist

    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


def device() -> torch.device:
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


# ---- seeding --------------------------------------------------------------------------------------------


def seed_all(seed: int) -> None:
    """Same value on every rank before the model is built, so all systems start from identical weights."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def rank_seed(seed: int, rank: int) -> int:
    """Per-rank stream for dropout and augmentation (ranks must not draw identical masks)."""
    return (seed * 1_000_003 + 7919 * (rank + 1)) % (2**63 - 1)


def rng_state() -> dict[str, Any]:
    """Everything a resumed run needs to draw the same dropout masks and augmentations."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


# ---- DeepSpeed config -----------------------------------------------------------------------------------


def load_ds_config(path: str, micro_batch: Optional[int] = None) -> dict[str, Any]:
    """The config as a dict (runners pass dicts to DeepSpeed so overrides need no temporary files)."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise RunnerError(f"DeepSpeed config {path} not found") from None
    if micro_batch is not None:
        cfg["train_micro_batch_size_per_gpu"] = int(micro_batch)
        cfg.pop("train_batch_size", None)
    return cfg


def without_gravac(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config plain DeepSpeed sees for ``--system deepspeed`` (it would ignore the section anyway; removing
    it makes the checkpoint and wandb config say what actually ran)."""
    out = copy.deepcopy(cfg)
    out.pop("gravac", None)
    return out


def check_monitors(cfg: dict[str, Any], runner_wandb: bool) -> None:
    """DeepSpeed's wandb monitor logs with step=global_samples and makes wandb drop the runner's points,
    so the two never run together."""
    monitor = cfg.get("wandb")
    if runner_wandb and isinstance(monitor, dict) and monitor.get("enabled", False):
        raise RunnerError('the DeepSpeed config enables its own "wandb" monitor while the runner logs to wandb; '
                          'both in one run make wandb drop the runner\'s steps. Remove "wandb" from the config '
                          "or pass --no-wandb")


def micro_batch_size(cfg: dict[str, Any], world_size: int) -> int:
    """DeepSpeed's rule: micro batch from the config, else train_batch_size / (gas * world)."""
    if "train_micro_batch_size_per_gpu" in cfg:
        return int(cfg["train_micro_batch_size_per_gpu"])
    gas = int(cfg.get("gradient_accumulation_steps", 1))
    if "train_batch_size" not in cfg:
        raise RunnerError("the DeepSpeed config sets neither train_micro_batch_size_per_gpu nor train_batch_size")
    return int(cfg["train_batch_size"]) // (gas * world_size)
