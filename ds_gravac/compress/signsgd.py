"""``signsgd``: sign bits only, merged by majority vote (signSGD with majority vote).

Workers send ``b_i = [x_i ≥ 0]`` (``int32[ceil(L/32)]``, no header, no error feedback). The owner of a partition
does not average decodes: :meth:`SignSGD.merge_decode` writes the vote count ``v_i = Σ_w (2·b_{w,i} − 1)``
(exact small integers: the sum of the ±1 decodes), and :meth:`SignSGD.server_encode` sends the sign bits of
``v`` — the majority, a tie ``v_i = 0`` counting as +1 like a zero input (ties only occur for an even number of
ranks). Everyone then decodes ``G_i = ±1``: the learning rate alone sets the step length, so it is meant for plain
SGD in static mode (no gain is defined). θ = 32.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import signbits
from .base import CompressCtx, CompressorParams, Payload, Section, TensorPlan
from .quantize import Quantizer

Tensor = torch.Tensor


class SignSGDParams(CompressorParams):
    """No parameters: the payload is the sign and nothing else."""


class SignSGD(Quantizer):
    """Sign bits; the owner re-encodes the majority of its ranks' signs."""

    name = "signsgd"
    Params = SignSGDParams
    GRID = (32.0,)
    CODES = signbits.BITS

    @property
    def worker_error_feedback(self) -> bool:
        return False          # plain signSGD: no error feedback (EF-signSGD is its own compressor)

    def sections(self, numel: int, theta: float) -> tuple[Section, ...]:
        return signbits.sections(numel, 0)

    def code_bits(self, plan: TensorPlan) -> int:
        return 1

    def encode(self, x: Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx, server: bool) -> None:
        signbits.encode_signs(x, out, self.ws)

    def code_levels(self, p: Payload, dtype: torch.dtype, scale: float) -> Tensor:
        return signbits.levels(-1.0, 1.0, dtype, p.words.device, scale)

    def merge_decode(self, payloads: Sequence[Payload], y: Tensor, ctx: CompressCtx,
                     server_residual: Optional[Tensor] = None) -> None:
        """``y = v = Σ_w (2·b_w − 1)``, the vote count (not divided by N; ``server_residual`` must be None): the
        sum of the ±1 decodes, exact small integers."""
        if server_residual is not None:
            raise ValueError("ds_gravac: signsgd keeps no server residual")
        self.decode_sum(payloads, y, 1.0, "zero")

    def sent_sq_norm(self, p: Payload, ctx: Optional[CompressCtx] = None) -> Tensor:
        return torch.tensor(float(p.plan.numel), dtype=torch.float64, device=p.words.device)
