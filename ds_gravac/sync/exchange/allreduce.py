"""All-reduce patterns: DeepSpeed's exact dense all-reduce, and the all-reduce of summable payloads."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..collectives import all_reduce_async, ring_allreduce_bytes
from ..reduce_rule import ReduceRule
from .base import Exchange

if TYPE_CHECKING:
    from ..codec import BucketCodec, SendLayout


class DenseAllReduce(Exchange):
    """``allreduce_bucket`` of DeepSpeed, op for op: flatten in the gradient dtype (or take a given flat buffer),
    cast to the communication dtype, pre-scale, all-reduce, post-scale, copy back. Bit-identical to DeepSpeed's
    own averaging at N = 2."""

    def __init__(self, rule: ReduceRule, world_size: int, what: str, tensors: Sequence[torch.Tensor] = (),
                 flat: Optional[torch.Tensor] = None) -> None:
        super().__init__(what)
        self.rule = rule
        self.flat = flat if flat is not None else _flatten_dense_tensors(list(tensors))
        self.comm = self.flat if self.flat.dtype == rule.comm_dtype else self.flat.to(rule.comm_dtype)
        self.bytes_sent = ring_allreduce_bytes(self.comm.numel() * self.comm.element_size(), world_size)

    def launch(self, channels: Sequence[Any]) -> None:
        self.rule.prescale(self.comm)
        self.works[0] = all_reduce_async(self.comm, channels[0], f"all_reduce of {self.what}")

    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        self.rule.postscale_(self.comm)
        if self.comm is not self.flat:
            self.flat.copy_(self.comm)
        return self.flat

    def write_back(self, dest: Sequence[torch.Tensor]) -> None:
        """Unflatten into the gradients, exactly as DeepSpeed does."""
        for buf, synced in zip(dest, _unflatten_dense_tensors(self.flat, list(dest))):
            buf.copy_(synced)

    @staticmethod
    def pays(payload_words: int, numel: int, world_size: int, rule: ReduceRule) -> bool:
        return True


class PayloadAllReduce(Exchange):
    """Summable payloads (fp32 sections that add elementwise, e.g. Random-k values): one all-reduce, one decode."""

    def __init__(self, codec: "BucketCodec", layout: "SendLayout", world_size: int, what: str, bulk: bool) -> None:
        super().__init__(what)
        self.codec, self.layout = codec, layout
        self.bytes_sent = ring_allreduce_bytes(4 * layout.words, world_size)

    def launch(self, channels: Sequence[Any]) -> None:
        self.works[0] = all_reduce_async(self.layout.send, channels[0], f"all_reduce of {self.what}")

    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        assert out is not None
        self.codec.decode_sum(self.layout, out, scale)
        return out

    @staticmethod
    def pays(payload_words: int, numel: int, world_size: int, rule: ReduceRule) -> bool:
        return True


class HalfAllReduce(PayloadAllReduce):
    """Summable half-precision payloads (the ``fp16``/``bf16`` casts): the 32-bit word buffer is all-reduced as
    halves of the compressor's ``dtype``, so the packed values add in their own precision (summing the words as
    fp32 would add bit patterns). A section's pad half is zero on every rank and stays zero."""

    def launch(self, channels: Sequence[Any]) -> None:
        halves = self.layout.send.view(self.codec.comp.dtype)
        self.works[0] = all_reduce_async(halves, channels[0], f"all_reduce ({halves.dtype}) of {self.what}")
