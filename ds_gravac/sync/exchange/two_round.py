"""Two dependent all-reduces per bucket (PowerSGD): round 1 on the first data channel as soon as the bucket is
encoded, round 2 on the second data channel once round 1 is reduced and the compressor has built the second
payload from it (``compressor.next_round``: orthogonalize the summed ``P``, project ``Xᵀ`` onto it).

Why this cannot hang the way PyTorch's ``powerSGD_hook`` does on gloo with several buckets: the scheduler issues
round 1 of every bucket in plan order on one process group and round 2 of every bucket in plan order on another,
so each group sees the same sequence of collectives on every rank whatever the timing; two rounds of different
buckets never share a group, and no round waits on a collective that another rank has not issued yet.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ..collectives import Work, all_reduce_async, ring_allreduce_bytes
from ..reduce_rule import ReduceRule
from .base import Exchange

if TYPE_CHECKING:
    from ..codec import BucketCodec, SendLayout


class TwoRoundAllReduce(Exchange):
    """Round 1: the bucket's first payloads (factors and plain values); round 2: the second factors."""

    rounds = 2

    def __init__(self, codec: "BucketCodec", layout: "SendLayout", world_size: int, what: str, bulk: bool) -> None:
        super().__init__(what)
        self.codec, self.layout = codec, layout
        second = layout.round2.numel() if layout.round2 is not None else 0
        self.bytes_sent = (ring_allreduce_bytes(4 * layout.words, world_size)
            + ring_allreduce_bytes(4 * second, world_size))

    def launch(self, channels: Sequence[Any]) -> None:
        self.works[0] = all_reduce_async(self.layout.send, channels[0], f"all_reduce (round 1) of {self.what}")

    def advance(self, r: int, channels: Sequence[Any]) -> None:
        self.codec.next_round(self.layout)
        second = self.layout.round2
        if second is None or second.numel() == 0:     # every member went plain: nothing to send (same on all ranks)
            self.works[1] = Work(None, 0.0, 0, f"round 2 of {self.what}")
            return
        self.works[1] = all_reduce_async(second, channels[1], f"all_reduce (round 2) of {self.what}")

    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        assert out is not None
        self.codec.decode_rounds(self.layout, out, scale)
        return out

    @staticmethod
    def pays(payload_words: int, numel: int, world_size: int, rule: ReduceRule) -> bool:
        return True
