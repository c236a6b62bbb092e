"""A fail-fast check for compressors whose indices come from a shared random stream (Random-k): if two ranks drew
different indices (another seed, another library version), their payloads would be summed position by position
into garbage without any error. At the first compressed step the ranks compare digests of what they selected."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..compress.base import Compressor, stable_hash
from .collectives import check_agreement

if TYPE_CHECKING:
    from .exchange.base import Codec


class SharedSelectionCheck:
    """Collects the first compressed step's selection digests and compares them across ranks once."""

    def __init__(self, comp: Compressor, control: Any) -> None:
        self.active = comp.shared_indices
        self.control = control
        self.digests: list[int] = []

    def record(self, codec: "Codec", levels: tuple[float, ...]) -> None:
        if self.active:
            self.digests.append(codec.shared_selection_digest(levels))

    def check(self) -> None:
        """Called at the end of every backward; compares once, after the first step that recorded a digest."""
        if not (self.active and self.digests):
            return
        self.active = False
        check_agreement(stable_hash(repr(self.digests)), self.control,
                        "ranks selected different Random-k indices at the first compressed step (the shared "
                        "random stream differs: check that every rank uses the same seed and library versions)")
