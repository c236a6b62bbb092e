"""The DeepSpeed config's ``optimizer`` and ``scheduler`` sections as torch objects, for the systems that train
without a DeepSpeed engine (DDP and its hooks), so every system runs the same optimizer and schedule."""
from __future__ import annotations

from typing import Any

import torch

from .common import RunnerError


def build_optimizer(cfg: dict[str, Any], params: Any) -> torch.optim.Optimizer:
    """The config's ``optimizer`` section as a torch optimizer: ``torch.optim`` names as DeepSpeed accepts
    them, and DeepSpeed's ``adam``/``adamw`` mapped to torch's (AdamW unless ``adam_w_mode`` is false)."""
    section = cfg.get("optimizer")
    if not section:
        raise RunnerError("the DeepSpeed config has no 'optimizer' section (runners pass no client optimizer)")
    name, kwargs = section["type"], dict(section.get("params", {}))
    kwargs.pop("torch_adam", None)
    if name.lower() in ("adam", "adamw"):
        cls = torch.optim.AdamW if kwargs.pop("adam_w_mode", True) or name.lower() == "adamw" else torch.optim.Adam
    else:
        cls = getattr(torch.optim, name, None) or next(
            (getattr(torch.optim, n) for n in dir(torch.optim) if n.lower() == name.lower()), None)
    if cls is None:
        raise RunnerError(f"optimizer type {name!r} has no torch equivalent for the DDP systems")
    return cls(params, **kwargs)


def build_scheduler(cfg: dict[str, Any], optimizer: torch.optim.Optimizer) -> Any:
    """Same lookup as DeepSpeed's ``_scheduler_from_config``: its own schedules first, then torch's."""
    section = cfg.get("scheduler")
    if not section:
        return None
    from deepspeed.runtime import lr_schedules

    name = section["type"]
    cls = getattr(lr_schedules, name, None) or getattr(torch.optim.lr_scheduler, name, None)
    if cls is None:
        raise RunnerError(f"unknown LR scheduler {name!r}")
    return cls(optimizer, **section.get("params", {}))
