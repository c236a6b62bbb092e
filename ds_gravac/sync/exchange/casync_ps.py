"""Parameter server with co-located servers (CaSync-PS) for quantizers: all-to-all, owner merge, all-gather.

Every rank owns one partition of each bucket (``ds_gravac.sync.partition_codec``). Round 0 (channel 1):
``all_to_all_single`` of the send buffer, so rank ``j`` receives every rank's payload of partition ``j``.
Between the rounds (:meth:`CaSyncPS.advance`) the owner decodes and averages them, adds its server residual,
re-encodes the merged partition into ``q_j`` and stages the residual ``y_j − D(q_j)`` (adopted by the scheduler
only after the step's agreement). Round 1 (channel 2): ``all_gather_into_tensor`` of the ``q_j``; every rank,
the owner included, decodes all ``N`` of them, so replicas apply bit-identical gradients (the owner never uses its
exact ``y_j``).

Per rank this moves ``(N−1)·P`` words in each round for a partition payload of ``P`` words — the structure of a
ring all-reduce at the compressed size — against ``(N−1)·N·P`` for gathering every rank's whole-bucket payload.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ..collectives import all_gather_async, all_to_all_async
from ..reduce_rule import ReduceRule
from .base import Exchange

if TYPE_CHECKING:
    from ..codec import SendLayout
    from ..partition_codec import PartitionCodec


def _buffer(layout: "SendLayout", name: str, numel: int) -> torch.Tensor:
    """A receive buffer cached on the layout (dropped with it when its level is no longer used)."""
    buf = layout.buffers.get(name)
    if buf is None:
        buf = layout.buffers[name] = torch.zeros(numel, dtype=torch.int32, device=layout.send.device)
    return buf


class CaSyncPS(Exchange):
    """Round 0: every partition to its owner; owner merge and re-encode; round 1: every owner's ``q`` to all."""

    rounds = 2

    def __init__(self, codec: "PartitionCodec", layout: "SendLayout", world_size: int, what: str, bulk: bool) -> None:
        super().__init__(what)
        self.codec, self.layout, self.world_size = codec, layout, world_size
        self.words = layout.words // world_size              # one partition's payload
        self.recv = _buffer(layout, "ps_recv", layout.words)
        self.q = _buffer(layout, "ps_q", self.words)
        self.gathered = _buffer(layout, "ps_gathered", layout.words)
        self.bytes_sent = 2.0 * (world_size - 1) * 4 * self.words

    def launch(self, channels: Sequence[Any]) -> None:
        self.works[0] = all_to_all_async(self.recv, self.layout.send, channels[0], f"all_to_all of {self.what}")

    def advance(self, r: int, channels: Sequence[Any]) -> None:
        self.codec.serve(self.layout, self.recv, self.q)
        self.works[1] = all_gather_async(self.gathered, self.q, channels[1], f"all_gather (owners) of {self.what}")

    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        """``q_j`` already holds the average over ranks, so the mean rule's ``1/N`` becomes 1 (a sum rule: N)."""
        assert out is not None
        self.codec.decode_owners(self.layout, self.gathered.view(self.world_size, self.words), out,
                                 scale * self.world_size)
        return out

    @staticmethod
    def pays(payload_words: int, numel: int, world_size: int, rule: ReduceRule) -> bool:
        """Per rank ``2(N−1)·4P`` bytes against the dense ring's ``2(N−1)/N·c·m`` (``payload_words = N·P``)."""
        return 4 * payload_words < rule.comm_bytes_per_element * numel
