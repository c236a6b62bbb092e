"""PyTorch's own DDP communication schemes as runner systems: PowerSGD, the bf16 compression hook and post-local
SGD. Each :class:`CommScheme` registers torch's hook on the DDP module, may wrap the optimizer (post-local SGD's
``PostLocalSGDOptimizer``), and says how many bytes one rank sent in the last optimizer step, so every DDP system
writes the same step records as DeepSpeed and ds_gravac.

Nothing here re-implements an algorithm: compression, error feedback, the switch to local steps and the periodic
model averaging are torch's (``torch.distributed.algorithms``); only the byte accounting is ours.
"""
from __future__ import annotations

from typing import Any

import torch


class CommScheme:
    """Plain DDP: every step all-reduces every gradient in fp32."""

    name = "ddp"

    def register(self, ddp: Any) -> None:
        pass

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def sent_bytes(self, ring: float, per_value: float) -> float:
        """Bytes one rank sent in the optimizer step just taken: ``ring`` is the fp32 ring all-reduce of every
        gradient, ``per_value`` its bytes per value (2(N-1)/N · 4)."""
        return ring

    def local_state(self) -> dict[str, Any]:
        return {}

    def load_local_state(self, state: dict[str, Any]) -> None:
        pass


POWERSGD = dict(start_powerSGD_iter=10, min_compression_rate=2,
                use_error_feedback=True, warm_start=True, orthogonalization_epsilon=1e-8, random_seed=0)


class PowerSGD(CommScheme):
    """torch's ``powerSGD_hook`` (rank ``rank``, start at iteration 10), serialized bucket by bucket so that it
    runs on gloo (:mod:`runners.ddp_hooks`). Bytes: the ring formula on the values its all-reduces carried this
    step (P and Q factors plus the uncompressed tensors, from the hook's own counter); dense before
    ``start_powerSGD_iter``, when the hook runs a vanilla all-reduce and counts nothing."""

    name = "ddp_powersgd"

    def __init__(self, rank: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        self.state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=rank, **POWERSGD)
        self._numel_after = 0

    def register(self, ddp: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        from .ddp_hooks import serialized

        ddp.register_comm_hook(self.state, serialized(ps.powerSGD_hook))

    def sent_bytes(self, ring: float, per_value: float) -> float:
        total = int(self.state.total_numel_after_compression)
        sent, self._numel_after = total - self._numel_after, total
        return sent * per_value if sent > 0 else ring

    def local_state(self) -> dict[str, Any]:
        return {"powersgd": self.state.__getstate__()}

    def load_local_state(self, state: dict[str, Any]) -> None:
        if "powersgd" in state:
            for key, value in state["powersgd"].items():
                setattr(self.state, key, value)
            self._numel_after = int(self.state.total_numel_after_compression)


class Bf16(CommScheme):
    """torch's ``bf16_compress_hook``: each bucket cast to bfloat16, all-reduced, divided and cast back — half of
    fp32's bytes on every step."""

    name = "ddp_bf16"

    def register(self, ddp: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)

    def sent_bytes(self, ring: float, per_value: float) -> float:
        return ring / 2.0


class PostLocalSGD(CommScheme):
    """torch's post-local SGD: ``post_localSGD_hook`` all-reduces gradients for the first ``start`` steps, then
    each rank steps on its own gradient (``post_local_gradient_allreduce=False``: every rank is its own node),
    and ``PostLocalSGDOptimizer`` with a ``PeriodicModelAverager`` all-reduces the parameters every ``period``
    steps from ``start`` on. Bytes: the fp32 ring on gradient-sync steps and on averaging steps, 0 otherwise
    (the buffers DDP broadcasts before each forward — BatchNorm statistics — are not counted, as for every DDP
    system)."""

    name = "ddp_localsgd"

    def __init__(self, period: int, start: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl

        self.period, self.start = period, start
        self.state = pl.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=start,
                                          post_local_gradient_allreduce=False)
        self.averager: Any = None

    def register(self, ddp: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as pl

        ddp.register_comm_hook(self.state, pl.post_localSGD_hook)

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        from torch.distributed.algorithms.model_averaging import averagers
        from torch.distributed.optim import PostLocalSGDOptimizer

        self.averager = averagers.PeriodicModelAverager(period=self.period, warmup_steps=self.start)
        return PostLocalSGDOptimizer(optim=optimizer, averager=self.averager)

    def sent_bytes(self, ring: float, per_value: float) -> float:
        step = int(self.averager.step) - 1          # the step just taken (the averager counts from 0)
        averaged = step >= self.start and (step - self.start) % self.period == 0
        return ring if step < self.start or averaged else 0.0

    def local_state(self) -> dict[str, Any]:
        return {"localsgd_iter": int(self.state.iter)}

    def load_local_state(self, state: dict[str, Any]) -> None:
        if "localsgd_iter" in state:
            self.state.iter = int(state["localsgd_iter"])


def scheme_for(system: str, args: Any) -> CommScheme:
    """The scheme of a runner ``--system`` (``ddp`` and ``local`` are plain)."""
    if system == "ddp_powersgd":
        return PowerSGD(int(getattr(args, "powersgd_rank", 4)))
    if system == "ddp_bf16":
        return Bf16()
    if system == "ddp_localsgd":
        return PostLocalSGD(int(getattr(args, "localsgd_period", 8)), int(getattr(args, "localsgd_start", 0)))
    return CommScheme()
