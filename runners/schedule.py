"""The long benchmark's learning-rate schedule: linear warm-up, then ×gamma at fixed fractions of the budget.

Why here and not in the DeepSpeed config: DeepSpeed's own schedules have no step decay after a warm-up, and a
torch ``MultiStepLR`` in the config has no warm-up and fixed step numbers. The runners build this one as a torch
``LambdaLR`` on whatever optimizer the system uses (DeepSpeed's ``lr_scheduler`` callable, or DDP's optimizer),
with milestones taken as fractions of ``--steps``, so one flag set scales with the budget and every system runs
exactly the same schedule.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


@dataclass(frozen=True)
class StepSchedule:
    """``lr(step) = base · min(1, (step + 1) / warmup) · gamma^(milestones passed)``; ``step`` counts optimizer
    steps from 0, milestones are step numbers (from the fractions of the budget)."""

    warmup: int
    milestones: tuple[int, ...]
    gamma: float

    def factor(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup) if self.warmup > 0 else 1.0
        return warm * self.gamma ** sum(step >= m for m in self.milestones)

    def scheduler(self, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor)


def parse_fractions(text: str) -> tuple[float, ...]:
    """``"0.5,0.75"`` → (0.5, 0.75); each in (0, 1), increasing, or a clear error."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lr-decay-at: expected fractions of --steps such as 0.5,0.75, "
                                         f"got {text!r}") from None
    if not values or any(not 0.0 < v < 1.0 for v in values) or list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"--lr-decay-at: fractions must lie in (0, 1) and increase, got {text!r}")
    return values


def from_args(args: argparse.Namespace) -> Optional[StepSchedule]:
    """The schedule the runner flags ask for, or None (the config's own ``scheduler`` section then applies)."""
    fractions: tuple[float, ...] = getattr(args, "lr_decay_at", None) or ()
    warmup = int(getattr(args, "lr_warmup", 0) or 0)
    if not fractions and not warmup:
        return None
    return StepSchedule(warmup, tuple(int(round(f * args.steps)) for f in fractions),
                        float(getattr(args, "lr_decay_gamma", 0.1)))


def scheduler_factory(args: argparse.Namespace) -> Optional[Callable[[Any], Any]]:
    """What ``deepspeed.initialize(lr_scheduler=...)`` takes: a callable from the optimizer to the scheduler."""
    schedule = from_args(args)
    return None if schedule is None else schedule.scheduler
