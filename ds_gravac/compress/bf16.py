"""``bf16``: bfloat16 communication, pre-divided by the world size (see ``cast``)."""
from __future__ import annotations

import torch

from .cast import HalfCast


class BF16(HalfCast):
    """Summable bf16 cast of ``x/N``: fp32's range with 8 significant bits (relative error ≤ 2^-8)."""

    name = "bf16"
    dtype = torch.bfloat16
