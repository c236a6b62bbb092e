"""Tensor fusion: which gradients travel together, in one order every rank shares."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import torch

from ..compress.base import Compressor, stable_hash
from ..config import GravacConfig

logger = logging.getLogger("ds_gravac")

INT32_LIMIT = 2**31


@dataclass
class Member:
    """One parameter's place in the plan."""

    index: int                 # position in registration order (engine.module.named_parameters)
    name: str
    param: torch.Tensor
    compressible: bool
    bucket: int = -1
    offset: int = 0            # element offset inside its bucket

    @property
    def numel(self) -> int:
        return self.param.numel()

    @property
    def dtype(self) -> torch.dtype:
        return self.param.dtype


@dataclass
class Bucket:
    """Members fused into one collective; ``compressible`` buckets hold only compressible members."""

    index: int
    compressible: bool
    dtype: torch.dtype
    members: list[Member] = field(default_factory=list)
    numel: int = 0

    def add(self, member: Member) -> None:
        member.bucket = self.index
        member.offset = self.numel
        self.members.append(member)
        self.numel += member.numel


def classify(named_params: Sequence[tuple[str, torch.Tensor]], accepts: Callable[[tuple[int, ...]], bool],
             min_compress_numel: int, compress_enabled: bool) -> list[Member]:
    """Static classification (compressible or dense) of every trainable parameter, in registration order."""
    members = []
    for i, (name, p) in enumerate(named_params):
        compressible = compress_enabled and p.numel() >= max(1, min_compress_numel) and accepts(tuple(p.shape))
        if compressible and p.numel() >= INT32_LIMIT:       # payload indices are int32; dense sends need none
            logger.warning("ds_gravac: parameter '%s' has %d elements (>= 2^31, beyond int32 payload indices): "
                           "it is always sent dense", name, p.numel())
            compressible = False
        members.append(Member(index=i, name=name, param=p, compressible=compressible))
    return members


def sync_members(named_params: Sequence[tuple[str, torch.Tensor]], config: GravacConfig,
                 compressor: Compressor) -> list[Member]:
    """The members a synchronizer plans with (attach and ``python -m ds_gravac.plan`` alike): nothing is
    compressible in mode ``dense`` or with the ``none`` compressor."""
    enabled = config.mode != "dense" and compressor.name != "none"
    return classify(named_params, compressor.accepts, config.min_compress_numel, enabled)


class BucketPlan:
    """Buckets built by walking tensors in backward order, filling each stream's open bucket up to the cap.

    A stream is (compressible, dtype) and, with ``groups`` (a controller's layer groups: member name → group), the
    member's group too: then no bucket mixes groups, so a quantizer, which encodes a bucket at one level, can send
    each group at its own level (``mode: "auto"``)."""

    def __init__(self, members: Sequence[Member], order: Sequence[int], cap_elems: int, *, frozen: bool,
                 compressor_type: str, groups: Optional[Mapping[str, int]] = None) -> None:
        if sorted(order) != list(range(len(members))):
            raise ValueError("ds_gravac: bucket order must be a permutation of the parameter indices")
        self.members = list(members)
        self.order = list(order)
        self.cap_elems = int(cap_elems)
        self.frozen = frozen
        self.compressor_type = compressor_type
        self.groups = dict(groups) if groups is not None else None
        self.buckets: list[Bucket] = []
        open_buckets: dict[tuple[bool, torch.dtype, int], Bucket] = {}
        for idx in self.order:
            m = self.members[idx]
            group = self.groups.get(m.name, -1) if self.groups is not None and m.compressible else -1
            stream = (m.compressible, m.dtype, group)
            b = open_buckets.get(stream)
            if b is None or (b.numel > 0 and b.numel + m.numel > self.cap_elems):
                b = Bucket(index=len(self.buckets), compressible=m.compressible, dtype=m.dtype)
                self.buckets.append(b)
                open_buckets[stream] = b
            b.add(m)
            if b.numel >= self.cap_elems:
                del open_buckets[stream]
        # Plan order = completion order: a bucket launches when its *last* member is ready, so a bucket that stays
        # open while later tensors join it (e.g. the small-tensor stream) must not block the buckets behind it.
        position = {idx: pos for pos, idx in enumerate(self.order)}
        self.buckets.sort(key=lambda bk: max(position[m.index] for m in bk.members))
        for new_index, bk in enumerate(self.buckets):
            bk.index = new_index
            for m in bk.members:
                m.bucket = new_index

    @property
    def num_buckets(self) -> int:
        return len(self.buckets)

    def layout_signature(self) -> int:
        """Hash of everything that fixes payload sizes; equal on every rank for the same frozen plan."""
        parts = [self.compressor_type, str(self.cap_elems)] + (["grouped"] if self.groups is not None else [])
        for b in self.buckets:
            for m in b.members:
                parts.append(f"{b.index}:{m.name}:{tuple(m.param.shape)}:{m.dtype}:{int(m.compressible)}")
        return stable_hash("|".join(parts))

    @staticmethod
    def provisional_order(num_members: int) -> list[int]:
        """Reverse registration order: a good first guess of backward order (as DDP assumes)."""
        return list(range(num_members - 1, -1, -1))

    @staticmethod
    def complete_order(ready_order: Sequence[int], num_members: int) -> list[int]:
        """Observed readiness order, then never-ready parameters in reverse registration order."""
        seen = set(ready_order)
        rest = [i for i in range(num_members - 1, -1, -1) if i not in seen]
        return list(ready_order) + rest
