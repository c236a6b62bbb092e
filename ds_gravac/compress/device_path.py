"""Which kernels a tensor takes: the CPU-only host kernels (numpy views, the generator tricks of ``qkernels``) or
the device path every accelerator takes (plain torch operations, counter-based random numbers).

On CPU the host kernels are several times faster per element, so CPU training uses them; any other device takes
the device path. :func:`force_device_path` makes CPU tensors take the device path as well, so the path a GPU runs
can be tested and measured on a machine without one (``tests/unit/test_select_torch_branch.py``, the host
synchronization test, ``ds_gravac_bench.device_check``). It is a process-wide switch for tests and checks, not a
config key: every rank of a run must take the same path, and a config key could differ between them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Union

import torch

_forced = False


def host_kernels(t: Union[torch.Tensor, torch.device]) -> bool:
    """True when ``t`` (a tensor, or a device) takes the CPU-only host kernels (CPU, the device path not forced)."""
    device = t if isinstance(t, torch.device) else t.device
    return device.type == "cpu" and not _forced


def forced() -> bool:
    return _forced


@contextlib.contextmanager
def force_device_path(on: bool = True) -> Iterator[None]:
    """Within the block, CPU tensors take the device path (``on``), or the host kernels again (not ``on``)."""
    global _forced
    before, _forced = _forced, on
    try:
        yield
    finally:
        _forced = before
