"""The contract between the scheduler (``ds_gravac.sync.synchronizer``) and an exchange pattern.

An exchange moves one bucket's payload across the ranks during one step. It is a fixed sequence of ``rounds``
dependent collectives; round ``r`` runs on data channel ``r`` (its own process group), so each channel sees the
rounds of all buckets in plan order on every rank, whatever the timing. The scheduler is the only caller and
guarantees:

* ``launch(channels)`` — issue round 0. Called in plan order, once the bucket's payload is final.
* ``advance(r, channels)`` — for ``r = 1 .. rounds−1``: the work between rounds (PowerSGD's orthogonalization, a
  parameter server's merge and re-encode, ...) and the issue of round ``r``. Called in plan order per round, and
  only after round ``r−1`` of this bucket has completed.
* ``completed(r)`` / ``wait(r)`` — poll / block on round ``r``.
* ``result(out, scale)`` — after the last round: the averaged gradient of the bucket as a flat tensor (``out``
  is where a decoded result goes; a dense exchange returns its own buffer).

An exchange never chooses anything: levels, sizes and the number of rounds come from the step plan, so every
rank issues the same collectives. It never commits persistent state either: error-feedback memory changes only
after the step's agreement (``ds_gravac.sync.memory``), so ``advance`` may compute but must keep whatever it
would change in step-local buffers until the scheduler commits. New patterns are new modules registered in
``ds_gravac.sync.exchange``; the scheduler does not change.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Sequence, Union

import torch

from ..collectives import Work

if TYPE_CHECKING:
    from ..codec import BucketCodec
    from ..partition_codec import PartitionCodec

# what a pattern encodes and decodes with: the bucket codec, or the partition codec of a quantizer
Codec = Union["BucketCodec", "PartitionCodec"]


class Exchange(ABC):
    """One bucket's payload on its way across the ranks (see the module docstring for the contract)."""

    rounds: ClassVar[int] = 1

    def __init__(self, what: str) -> None:
        self.what = what                     # names the bucket in error messages ("bucket 3 (compressed)")
        self.works: list[Optional[Work]] = [None] * self.rounds
        self.bytes_sent = 0.0                # logical bytes this rank sends, all rounds

    @abstractmethod
    def launch(self, channels: Sequence[Any]) -> None:
        """Issue round 0 on ``channels[0]``."""

    def advance(self, r: int, channels: Sequence[Any]) -> None:
        raise NotImplementedError(f"ds_gravac: {type(self).__name__} has {self.rounds} round(s), not {r + 1}")

    def completed(self, r: int) -> bool:
        work = self.works[r]
        return work is not None and work.is_completed()

    def wait(self, r: int) -> float:
        """Seconds blocked until round ``r`` completed."""
        work = self.works[r]
        if work is None:
            raise RuntimeError(f"ds_gravac: round {r} of {self.what} was never issued")
        return work.wait()

    def wait_all(self) -> float:
        return sum(w.wait() for w in self.works if w is not None)

    def channel_works(self) -> list[tuple[int, Work]]:
        """Every issued collective with the index of its data channel (the cost model's timing samples)."""
        return [(r, w) for r, w in enumerate(self.works) if w is not None]

    @abstractmethod
    def result(self, out: Optional[torch.Tensor], scale: float) -> torch.Tensor:
        """The averaged flat gradient of the bucket, after the last round."""
