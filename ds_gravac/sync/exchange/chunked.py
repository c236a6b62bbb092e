"""Chunked pipelining inside a bucket: one compressed bucket sent as K collectives of contiguous member groups.

Why: encoding runs on the main thread, the collective on gloo's own threads. Sent whole, a bucket's collective
starts only after its last member is encoded; sent in K chunks, chunk j's collective is in flight while chunk
j+1 is encoded, so the CPU and the link work at the same time (the cost model prices this and chooses K).

What stays the same as an unchunked send: every member is encoded whole, at the same level, into the same place of
the bucket's send buffer (a chunk's layout is a view of the bucket's), its memory is left by the same
``compressor.commit``, and every output element receives the same contributions in the same (rank) order. So the
gradients, the error-feedback memory and the statistics are those of one chunk — only the collectives differ.
Tensors are never split: a slice would be compressed as a tensor of its own (another top-k, other random
indices), which would change the result.

Rank agreement: the chunk count comes from the step plan and the member groups from :func:`chunk_spans` over the
frozen bucket plan, so every rank issues the same K collectives, in (bucket, chunk) order, on the first data
channel. Only single-round patterns over per-member payloads are chunked.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from ..collectives import Work
from .base import Codec, Exchange

if TYPE_CHECKING:
    from ..codec import SendLayout

MIN_CHUNK_NUMEL = 4096          # a chunk is worth its collective's fixed cost only above this many elements


def chunk_counts(numel: int, members: int, max_chunks: int) -> list[int]:
    """The chunk counts a bucket may be planned with: 1, 2, 4, … up to ``max_chunks``, while every chunk keeps
    ``numel / K >= 4096`` elements on average and there is at least one member per chunk."""
    out, k = [1], 2
    while k <= max_chunks and numel >= MIN_CHUNK_NUMEL * k and k <= members:
        out.append(k)
        k *= 2
    return out


def chunk_spans(numels: Sequence[int], k: int) -> list[tuple[int, int]]:
    """``k`` contiguous, non-empty groups of members (``(first, end)`` indexes) whose sizes are as close to
    ``m/k`` as whole members allow: the j-th cut is the member boundary nearest ``j·m/k`` that leaves room for
    the remaining groups. Integer arithmetic only, so it is the same on every rank."""
    k = max(1, min(int(k), len(numels)))
    prefix = [0]
    for n in numels:
        prefix.append(prefix[-1] + int(n))
    total, cuts = prefix[-1], [0]
    for j in range(1, k):
        lo, hi = cuts[-1] + 1, len(numels) - (k - j)
        cuts.append(min(range(lo, hi + 1), key=lambda c: (abs(k * prefix[c] - j * total), c)))
    cuts.append(len(numels))
    return [(cuts[j], cuts[j + 1]) for j in range(k)]


class ChunkedExchange(Exchange):
    """K exchanges of one single-round pattern, one per member group, issued in order as they are encoded."""

    def __init__(self, codec: Codec, layout: "SendLayout", levels: tuple[float, ...], pattern: type[Exchange],
                 spans: Sequence[tuple[int, int]], world_size: int, what: str, bulk: bool) -> None:
        super().__init__(what)
        if pattern.rounds != 1:
            raise ValueError(f"ds_gravac: only single-round patterns are chunked ({pattern.__name__} has "
                             f"{pattern.rounds} rounds)")
        self.codec, self.layout, self.levels, self.spans = codec, layout, levels, list(spans)
        members = codec.bucket.members
        self.elems = [(members[a].offset, members[b - 1].offset + members[b - 1].numel) for a, b in self.spans]
        k = len(self.spans)
        self.parts: list[Exchange] = [
            pattern(codec, codec.chunk(layout, span), world_size, f"{what} chunk {j + 1}/{k}", bulk)
            for j, span in enumerate(self.spans)]
        self.bytes_sent = sum(p.bytes_sent for p in self.parts)
        self.issued = 0

    def encode_and_issue(self, xs: Sequence[torch.Tensor], probes: Sequence[float], live: Sequence[bool],
                         channels: Sequence[Any], before_first: Callable[[], None]) -> tuple[Any, Any]:
        """Per chunk: encode its members (send and probe levels), leave their memory, issue its collective. The
        memory is left before the issue because an all-reduce overwrites the payload it reads. ``before_first``
        issues what the scheduler still holds of earlier buckets, so the channel sees plan order. Returns the
        layout and the encode statistics, as ``codec.encode`` of the whole bucket would."""
        stats = None
        for j, span in enumerate(self.spans):
            _, stats = self.codec.encode(xs, self.levels, probes, live, span=span, stats=stats)
            self.codec.leave_memory(xs, self.layout, span)
            if j == 0:
                before_first()
            self._issue_next(channels)
        return self.layout, stats

    def _issue_next(self, channels: Sequence[Any]) -> None:
        self.parts[self.issued].launch(channels)
        self.works[0] = self.parts[self.issued].works[0]        # the latest chunk stands for the round
        self.issued += 1

    def launch(self, channels: Sequence[Any]) -> None:
        """Issue every chunk not issued yet (none after :meth:`encode_and_issue`: then this is a no-op)."""
        while self.issued < len(self.parts):
            self._issue_next(channels)

    def completed(self, r: int) -> bool:
        return self.issued == len(self.parts) and all(p.completed(0) for p in self.parts)

    def wait(self, r: int) -> float:
        """Seconds blocked until every chunk completed (waited in issue order)."""
        if self.issued < len(self.parts):
            raise RuntimeError(f"ds_gravac: chunk {self.issued + 1} of {self.what} was never issued")
        return sum(p.wait(0) for p in self.parts)

    def wait_all(self) -> float:
        return sum(p.wait_all() for p in self.parts[:self.issued])

    def channel_works(self) -> list[tuple[int, Work]]:
        return [cw for p in self.parts for cw in p.channel_works()]

    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        """Each chunk decodes into its own slice of ``out``."""
        assert out is not None
        for p, (e0, e1) in zip(self.parts, self.elems):
            p.result(out[e0:e1], scale)
        return out
