"""The engine's gradient-averaging rule, read once at attach and applied exactly as DeepSpeed applies it.

DeepSpeed's ``allreduce_bucket`` flattens in the gradient dtype, casts to ``communication_data_type``, scales
before the sum (``prescale_gradients``: 1/N; default: 1/``gradient_predivide_factor``) and after it
(``predivide/N``), as multiplications. Reproducing those ops in that order is what makes ``mode: "dense"``
bit-identical to DeepSpeed's own path at N = 2; compressed buckets fold all of it into one output scale.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class ReduceRule:
    """The engine's averaging knobs, read once at attach."""

    average: bool
    postscale: bool
    predivide: float
    comm_dtype: torch.dtype
    world_size: float
    divide_first: bool = False      # ZeRO-1/2 with reduce_scatter: each rank divides by N, then the sum
    engine_dtype: Optional[torch.dtype] = None      # what DeepSpeed itself would send, when ``sending`` changed it


    @classmethod
    def from_engine(cls, engine: Any, world_size: int) -> "ReduceRule":
        """The rule DeepSpeed applies to this engine: ``allreduce_bucket`` with ZeRO-0, the ZeRO optimizer's own
        (``average_tensor``: divide, then sum; or its all-reduce with pre/post-division) with ZeRO-1/2."""
        zero = getattr(engine, "zero_optimization_stage", lambda: 0)() in (1, 2)
        opt = engine.optimizer
        if zero:
            return cls(average=bool(opt.gradient_average), postscale=bool(opt.postscale_gradients),
                       predivide=float(opt.gradient_predivide_factor), comm_dtype=opt.communication_data_type,
                       world_size=float(world_size), divide_first=bool(opt.reduce_scatter))
        return cls(average=bool(engine.gradient_average), postscale=bool(engine.postscale_gradients()),
                   predivide=float(engine.gradient_predivide_factor()),
                   comm_dtype=engine.communication_data_type, world_size=float(world_size))

    @property
    def output_scale(self) -> float:
        """``s`` of compressed buckets: ``1/N`` for mean, ``1`` for sum (pre/post-scaling folded in)."""
        return 1.0 / self.world_size if self.average else 1.0

    def sending(self, dtype: torch.dtype) -> "ReduceRule":
        """The same averaging with dense buckets all-reduced in ``dtype`` (DeepSpeed's own dtype is remembered:
        ``dense_bytes`` stays what DeepSpeed would send in this run)."""
        return dataclasses.replace(self, comm_dtype=dtype, engine_dtype=self.engine_dtype or self.comm_dtype)

    @property
    def comm_bytes_per_element(self) -> int:
        """Bytes per value of a dense bucket as this run sends it."""
        return torch.empty((), dtype=self.comm_dtype).element_size()

    @property
    def engine_bytes_per_element(self) -> int:
        """Bytes per value of DeepSpeed's own all-reduce on this engine (the reference of ``dense_bytes``)."""
        return torch.empty((), dtype=self.engine_dtype or self.comm_dtype).element_size()

    def prescale(self, c: torch.Tensor) -> None:
        if not self.average:
            return
        if self.divide_first:
            c.div_(self.world_size)
            return
        if self.postscale:
            if self.predivide != 1.0:
                c.mul_(1.0 / self.predivide)
        else:
            c.mul_(1.0 / self.world_size)

    def postscale_(self, c: torch.Tensor) -> None:
        if self.average and not self.divide_first and self.postscale and self.predivide != self.world_size:
            c.mul_(self.predivide / self.world_size)
