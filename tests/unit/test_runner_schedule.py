"""The runners' learning-rate schedule: linear warm-up, then ×gamma at fractions of the budget, as a torch LambdaLR
on a real optimizer; bad flags are refused before training."""
from __future__ import annotations

import argparse

import pytest
import torch

from runners.schedule import StepSchedule, from_args, parse_fractions


def test_the_scheduler_follows_the_closed_form_on_a_real_optimizer() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5, momentum=0.9)
    args = argparse.Namespace(steps=20, lr_warmup=4, lr_decay_at=(0.5, 0.75), lr_decay_gamma=0.1)
    schedule = from_args(args)
    assert schedule == StepSchedule(4, (10, 15), 0.1)
    sched = schedule.scheduler(opt)
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])     # the lr this step uses
        opt.step()
        sched.step()
    want = [0.5 * min(1.0, (k + 1) / 4) * (0.1 if k >= 10 else 1.0) * (0.1 if k >= 15 else 1.0) for k in range(20)]
    assert seen == pytest.approx(want)
    assert seen[3] == seen[9] == pytest.approx(0.5) and seen[10] == pytest.approx(0.05)
    assert seen[15] == pytest.approx(0.005)


def test_no_flag_leaves_the_config_schedule() -> None:
    assert from_args(argparse.Namespace(steps=10, lr_warmup=0, lr_decay_at=(), lr_decay_gamma=0.1)) is None


@pytest.mark.parametrize("text", ["", "0.5,0.4", "1.0", "0", "a,b", "0.5,0.5"])
def test_bad_fractions_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--lr-decay-at"):
        parse_fractions(text)


def test_runner_flags_are_checked_before_training(capsys: pytest.CaptureFixture[str]) -> None:
    from runners.train_cifar import parse_args

    base = ["--deepspeed_config", "ds_configs/mlp_dense.json", "--steps", "10"]
    assert parse_args(base + ["--lr-warmup", "2", "--lr-decay-at", "0.5,0.75"]).lr_decay_at == (0.5, 0.75)
    assert parse_args(base + ["--lr-warmup", "300"]).lr_warmup == 300        # a shortened long task keeps its warm-up
    for bad, message in ((["--lr-warmup", "-1"], "--lr-warmup must be >= 0"),
                         (["--lr-decay-gamma", "0"], "--lr-decay-gamma must be in"),
                         (["--localsgd-period", "0"], "--localsgd-period must be >= 1"),
                         (["--final-eval-batches", "-1"], "--final-eval-batches must be >= 0 (0: the whole"),
                         (["--eval-batches", "-2"], "--eval-batches must be >= 0")):
        with pytest.raises(SystemExit):
            parse_args(base + bad)
        assert message in capsys.readouterr().err
