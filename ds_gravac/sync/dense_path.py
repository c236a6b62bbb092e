"""DeepSpeed-exact dense all-reduce of a group of tensors (deepspeed.md §4).

Same ops, same order, same dtype as ``DeepSpeedEngine.allreduce_bucket``: flatten in the gradient dtype, cast to
``communication_data_type``, pre/post-scale, copy back, unflatten. That is what makes ``mode: "dense"``
bit-identical to DeepSpeed's own path at N = 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .collectives import Work, all_reduce_async


@dataclass(frozen=True)
class ReduceRule:
    """The engine's averaging knobs, read once at attach."""

    average: bool
    postscale: bool
    predivide: float
    comm_dtype: torch.dtype
    world_size: float

    @classmethod
    def from_engine(cls, engine: Any, world_size: int) -> "ReduceRule":
        return cls(average=bool(engine.gradient_average), postscale=bool(engine.postscale_gradients()),
                   predivide=float(engine.gradient_predivide_factor()),
                   comm_dtype=engine.communication_data_type, world_size=float(world_size))

    @property
    def output_scale(self) -> float:
        """``s`` of compressed buckets: ``1/N`` for mean, ``1`` for sum (pre/post-scaling folded in)."""
        return 1.0 / self.world_size if self.average else 1.0

    @property
    def comm_bytes_per_element(self) -> int:
        return torch.empty((), dtype=self.comm_dtype).element_size()

    def prescale(self, c: torch.Tensor) -> None:
        if not self.average:
            return
        if self.postscale:
            if self.predivide != 1.0:
                c.mul_(1.0 / self.predivide)
        else:
            c.mul_(1.0 / self.world_size)

    def postscale_(self, c: torch.Tensor) -> None:
        if self.average and self.postscale and self.predivide != self.world_size:
            c.mul_(self.predivide / self.world_size)


class DenseReduce:
    """One in-flight dense all-reduce; ``finish`` writes the averaged values back into ``dest`` tensors."""

    def __init__(self, tensors: Sequence[torch.Tensor], rule: ReduceRule, group: Any,
                 flat: Optional[torch.Tensor] = None) -> None:
        self.rule = rule
        self.flat = flat if flat is not None else _flatten_dense_tensors(list(tensors))
        self.comm = self.flat if self.flat.dtype == rule.comm_dtype else self.flat.to(rule.comm_dtype)
        rule.prescale(self.comm)
        self.work: Work = all_reduce_async(self.comm, group)

    @property
    def payload_bytes(self) -> int:
        return self.comm.numel() * self.comm.element_size()

    def wait(self) -> float:
        waited = self.work.wait()
        self.rule.postscale_(self.comm)
        if self.comm is not self.flat:
            self.flat.copy_(self.comm)
        return waited

    def write_back(self, dest: Sequence[torch.Tensor]) -> None:
        for buf, synced in zip(dest, _unflatten_dense_tensors(self.flat, list(dest))):
            buf.copy_(synced)
