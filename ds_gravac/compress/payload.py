"""The data a compressor works on: the wire layout of one tensor's payload (typed sections of a 32-bit word
buffer, the per-level plan) and what the compressor may know about the tensor (:class:`CompressCtx`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class Section:
    """One typed section of a payload; ``count`` elements of ``dtype``, starting on a 32-bit word boundary."""

    name: str
    dtype: torch.dtype
    count: int

    @property
    def words(self) -> int:
        """32-bit words occupied (fp16/bf16 sections take ``ceil(count/2)``)."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return (self.count * itemsize + 3) // 4


@dataclass(frozen=True)
class TensorPlan:
    """Per-tensor, per-level encoding plan: the knob (``k``) and the static wire layout."""

    numel: int
    level: float
    k: int
    sections: tuple[Section, ...]
    values_sent: int
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def words(self) -> int:
        return sum(s.words for s in self.sections)

    @property
    def wire_bytes(self) -> int:
        return 4 * self.words

    def offset_of(self, name: str) -> int:
        """Word offset of a section inside this tensor's payload."""
        off = 0
        for sec in self.sections:
            if sec.name == name:
                return off
            off += sec.words
        raise KeyError(name)

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.extra).get(key, default)


class Payload:
    """Typed section views into a slice of a 4-byte word buffer (int32 or float32)."""

    __slots__ = ("plan", "words", "_views")

    def __init__(self, plan: TensorPlan, words: torch.Tensor) -> None:
        if words.element_size() != 4 or words.dim() != 1 or words.numel() != plan.words:
            raise ValueError(f"ds_gravac: payload buffer must be 1-D 4-byte words of length {plan.words}")
        self.plan = plan
        self.words = words
        self._views: dict[str, torch.Tensor] = {}
        off = 0
        for sec in plan.sections:
            chunk = words[off:off + sec.words]
            view = chunk if chunk.dtype == sec.dtype else chunk.view(sec.dtype)
            self._views[sec.name] = view[:sec.count]
            off += sec.words

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._views[name]

    def __contains__(self, name: str) -> bool:
        return name in self._views

    @classmethod
    def allocate(cls, plan: TensorPlan, dtype: torch.dtype = torch.int32,
                 device: torch.device | str = "cpu") -> "Payload":
        return cls(plan, torch.zeros(plan.words, dtype=dtype, device=device))


@dataclass
class CompressCtx:
    """What a compressor may know about the tensor it encodes; ``memory`` holds its slots' views (``owns_state``)."""

    key: str
    step: int = 0
    rank: int = 0
    world_size: int = 1
    seed: int = 0
    residual: Optional[torch.Tensor] = None   # external EF segment (fp32), may alias x
    param: Optional[torch.Tensor] = None
    lr: float = 0.0
    weight_decay: float = 0.0
    momentum: float = 0.0
    error_feedback: bool = True
    shape: tuple[int, ...] = field(default_factory=tuple)
    memory: dict[str, torch.Tensor] = field(default_factory=dict)   # slot name → this tensor's flat fp32 view
