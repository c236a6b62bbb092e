"""All-gather of fixed-size word payloads (sparse ``(idx, val)`` and other non-summable encodings)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ..collectives import all_gather_async, allgather_bytes
from ..reduce_rule import ReduceRule
from .base import Codec, Exchange

if TYPE_CHECKING:
    from ..codec import SendLayout


class PayloadAllGather(Exchange):
    """Every rank receives every rank's payload (``[N, words]``) and decodes all rows, in rank order, into the
    same output: identical bytes and identical code give identical gradients on every rank."""

    def __init__(self, codec: Codec, layout: "SendLayout", world_size: int, what: str, bulk: bool) -> None:
        super().__init__(what)
        self.codec, self.layout, self.world_size, self.bulk = codec, layout, world_size, bulk
        self.recv = layout.buffers.get("allgather")
        if self.recv is None:
            self.recv = layout.buffers["allgather"] = torch.zeros(world_size * layout.words, dtype=torch.int32,
                                                                  device=layout.send.device)
        self.bytes_sent = allgather_bytes(4 * layout.words, world_size)

    def launch(self, channels: Sequence[Any]) -> None:
        self.works[0] = all_gather_async(self.recv, self.layout.send, channels[0], f"all_gather of {self.what}")

    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        assert out is not None
        self.codec.decode_rows(self.layout, self.recv.view(self.world_size, self.layout.words), out, scale,
                               self.bulk)
        return out

    @staticmethod
    def pays(payload_words: int, numel: int, world_size: int, rule: ReduceRule) -> bool:
        """Whether gathering moves fewer bytes than the dense ring all-reduce of the same bucket: per rank
        ``(N−1)·P`` against ``2(N−1)/N·c·m`` (c bytes per element of the communication dtype)."""
        n = world_size
        return (n - 1) * 4 * payload_words < 2.0 * (n - 1) / n * rule.comm_bytes_per_element * numel
