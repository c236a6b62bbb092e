"""``fp16``: IEEE half-precision communication, pre-divided by the world size (see ``cast``)."""
from __future__ import annotations

import torch

from .cast import HalfCast


class FP16(HalfCast):
    """Summable fp16 cast of ``x/N``; relative error ≤ 2^-11 in the normal range."""

    name = "fp16"
    dtype = torch.float16
