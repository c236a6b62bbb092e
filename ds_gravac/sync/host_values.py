"""Operations on host tensors only: sample indices drawn on the CPU, rows already copied to the host, gathered
statistics and the control channel's broadcasts (a gloo group). Whatever the training device, nothing here waits
for it, so the sync counter (``ds_gravac_bench.device_check_syncs``) lists this module as host-only; passing a
device tensor would be a bug."""
from __future__ import annotations

from typing import Any

import torch


def positions_within(idx: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Positions of the host indices ``idx`` that fall in ``[lo, hi)``."""
    return ((idx >= lo) & (idx < hi)).nonzero().view(-1)


def all_finite(values: torch.Tensor) -> bool:
    return bool(torch.isfinite(values).all())


def to_list(values: torch.Tensor) -> list[Any]:
    return values.tolist()


def fill_where(values: torch.Tensor, mask: torch.Tensor, fill: float) -> None:
    """``values[mask] = fill`` in place."""
    values[mask] = fill


def shared_coordinates(total: int, samples: int, key: str) -> torch.Tensor:
    """The step's sample coordinates over ``total`` elements, the same on every rank: every coordinate once when
    there are at most ``samples``, else ``samples`` uniform draws from the stream seeded by ``key``."""
    from ..compress.base import stable_hash
    if total <= samples:
        return torch.arange(total, dtype=torch.int64)
    gen = torch.Generator().manual_seed(stable_hash(key) & (2**62 - 1))
    return torch.randint(total, (samples,), generator=gen, dtype=torch.int64)


__all__ = ["all_finite", "fill_where", "positions_within", "shared_coordinates", "to_list"]
