"""The inputs of a plan: the config file, the model, the link rate, and a DeepSpeed engine built on this process
alone (a one-rank gloo group), so that attach's checks read the engine DeepSpeed really builds from the config.

Bad input raises :class:`PlanInputError` with a one-line message."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from typing import Any, Iterator

from torch import nn

from ..compress.registry import import_target
from ..integration.ports import free_port
from ..integration.shm_buffer import release_shm_buffer

RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(?:bit|b)?(?:/s|ps)?\s*$", re.IGNORECASE)
PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


class PlanInputError(ValueError):
    """A file, model name or option the plan cannot use (reported in one line, exit status 2)."""


def parse_rate(text: str) -> float:
    """``1gbit``, ``100mbit``, ``2.5Gbit/s``, ``1e9`` → bits per second."""
    match = RATE.match(text)
    rate = float(match.group(1)) * PREFIX[match.group(2).lower()] if match else math.nan
    if not (math.isfinite(rate) and rate > 0):
        raise PlanInputError(f"--rate {text!r} is not a link rate; write e.g. 1gbit, 100mbit or 10gbit")
    return rate


def read_config(path: str) -> dict[str, Any]:
    """The DeepSpeed JSON config as a dict."""
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except OSError as exc:
        raise PlanInputError(f"cannot read the config '{path}': {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"the config '{path}' is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise PlanInputError(f"the config '{path}' is not a JSON object")
    return config


def load_model(spec: str) -> nn.Module:
    """A torchvision model name (built with ``weights=None``) or ``module:callable`` (a zero-argument callable
    returning an ``nn.Module``)."""
    if ":" in spec:
        try:
            factory = import_target(spec)
        except (ImportError, AttributeError) as exc:
            raise PlanInputError(f"--model {spec!r}: cannot import it ({type(exc).__name__}: {exc})") from None
        try:
            model = factory()
        except Exception as exc:   # the user's code: any failure is reported as bad input, in one line
            raise PlanInputError(f"--model {spec!r}: calling it failed ({type(exc).__name__}: {exc})") from None
        if not isinstance(model, nn.Module):
            raise PlanInputError(f"--model {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    import torchvision
    if spec not in torchvision.models.list_models():
        raise PlanInputError(f"--model {spec!r} is neither a torchvision model name (e.g. resnet101) nor "
                             f"module:callable")
    return torchvision.models.get_model(spec, weights=None)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """DeepSpeed logs to stdout (its handler holds the stream, and compiled ops print): keep stdout for the
    report."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def for_one_rank(config: dict[str, Any], world_size: int) -> dict[str, Any]:
    """The config as one rank of ``world_size`` sees its batch: DeepSpeed checks ``train_batch_size`` = micro
    batch × accumulation × ranks, and this engine has one rank."""
    out = dict(config)
    total = out.get("train_batch_size")
    if isinstance(total, int) and not isinstance(total, bool):
        if total % world_size:
            raise PlanInputError(f"train_batch_size {total} is not divisible by --world-size {world_size}")
        out["train_batch_size"] = total // world_size
    return out


def build_engine(config: dict[str, Any], model: nn.Module, world_size: int) -> Any:
    """``deepspeed.initialize`` on a one-rank gloo group of this process (never a training step)."""
    with stdout_to_stderr():
        import deepspeed
        import deepspeed.comm as dist
        if not dist.is_initialized():
            os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
            release_shm_buffer(0)       # one rank: it has mapped every buffer of the group (shm_buffer.py)
        try:
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              config=for_one_rank(config, world_size))
        except Exception as exc:   # DeepSpeed's own refusal of the config, reported as bad input
            raise PlanInputError(f"DeepSpeed cannot build an engine from the config: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return engine


def release() -> None:
    """Destroy the one-rank group (a clean exit)."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["PlanInputError", "build_engine", "for_one_rank", "load_model", "parse_rate", "read_config", "release"]
