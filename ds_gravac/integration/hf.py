"""Hugging Face Trainer integration: one callback, no Trainer subclassing.

Callbacks receive the unwrapped module, not the engine, so the callback is built with the trainer and attaches to
``trainer.model_wrapped`` in ``on_train_begin`` — after the engine exists and after any checkpoint load, so it
restores the per-rank state of a resumed checkpoint itself. Saving needs nothing here: the Trainer calls
``engine.save_checkpoint``, which the attached handle routes through its own (per-rank files included).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

from transformers import TrainerCallback

from .checkpoint import read_rank_file
from .engine import GravacHandle, attach, get_handle

logger = logging.getLogger("ds_gravac")


class GravacCallback(TrainerCallback):
    """Attach ds_gravac to the Trainer's DeepSpeed engine; restore per-rank state when the Trainer resumes."""

    def __init__(self, trainer: Any, config: Optional[Mapping[str, Any]] = None,
                 resume_from: Optional[str] = None) -> None:
        self.trainer = trainer
        self.config = config
        self.resume_from = resume_from
        self.handle: Optional[GravacHandle] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        engine = self.trainer.model_wrapped
        if not hasattr(engine, "enable_backward_allreduce"):
            raise RuntimeError("ds_gravac: GravacCallback needs a DeepSpeed engine: pass TrainingArguments("
                               "deepspeed=...) with a config that has a \"gravac\" section")
        self.handle = attach(engine, config=self.config)
        directory = self._resume_dir(args, state)
        if directory is not None and self.handle.active:
            self._restore(directory)

    def _resume_dir(self, args: Any, state: Any) -> Optional[str]:
        if self.resume_from:
            return self.resume_from
        if state.global_step > 0:
            return os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        return None

    def _restore(self, checkpoint_dir: str) -> None:
        rank = self.handle.rank
        tag_dir = _tag_dir(checkpoint_dir)
        per_rank = read_rank_file(tag_dir, rank) if tag_dir else None
        if per_rank is None:
            logger.warning("ds_gravac: [rank %d] no ds_gravac state under %s: residuals start at zero",
                           rank, checkpoint_dir)
            return
        self.handle.load_state_dict({"replicated": per_rank.get("replicated", {}), "local": per_rank})

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        handle = self.handle
        if handle is None or not handle.active or not handle.config.telemetry.wandb or handle.rank != 0:
            return
        try:
            import wandb
        except ImportError:
            return
        record = handle.last_stats()
        if wandb.run is not None and record:
            from ..telemetry.sinks import numeric_metrics
            metrics = {f"gravac/{k}" if "/" not in k else k: v for k, v in numeric_metrics(record).items()}
            metrics["train/global_step"] = state.global_step
            wandb.log(metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.handle is not None:
            self.handle.drain()


def _tag_dir(checkpoint_dir: str) -> Optional[str]:
    """DeepSpeed's ``global_stepN`` directory inside an HF checkpoint (named by the ``latest`` file)."""
    latest = os.path.join(checkpoint_dir, "latest")
    if os.path.exists(latest):
        with open(latest, encoding="utf-8") as fh:
            return os.path.join(checkpoint_dir, fh.read().strip())
    if os.path.isdir(checkpoint_dir):
        tags = sorted(d for d in os.listdir(checkpoint_dir) if d.startswith("global_step"))
        if tags:
            return os.path.join(checkpoint_dir, tags[-1])
    return None


__all__ = ["GravacCallback", "get_handle"]
