"""Counting host synchronizations in ds_gravac's hot path.

On a GPU, ``.item()``, ``.tolist()``, ``bool(t)``, ``.cpu()``, ``float(t)``/``int(t)`` and every operation whose
output size depends on the data (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``) waits until
every queued kernel has run. :class:`SyncCounter` patches each of these calls and counts those made from ds_gravac's own code (the first frame outside torch), with the call site; DeepSpeed's own
calls are not ours to count. On CPU nothing synchronizes, so a count taken there under
``device_path.force_device_path()`` is the number of synchronizations the same step would make on a GPU.

Calls on tensors that are host tensors on every device are not counted: the gathered statistics table and the
control channel's broadcasts and agreement checks, and ``sync/host_values.py``'s operations on host copies and
CPU-drawn sample indices (``HOST_ONLY``: those tensors are created on the CPU whatever the device, and the control
channel is a gloo group). On CUDA, ``torch.cuda.set_sync_debug_mode`` is the
device's own check (``ds_gravac_bench.device_check``).
"""
from __future__ import annotations

import collections
import os
import sys
from typing import Any, Optional

import torch

import ds_gravac

_DS_DIR = os.path.dirname(os.path.abspath(ds_gravac.__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_THIS = os.path.abspath(__file__)

ALWAYS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero",
                    "argwhere", "masked_select", "unique", "unique_consecutive", "equal", "allclose",
                    "count_nonzero_static"})
# files whose tensors are host tensors on every device (created without a device; the control channel is gloo)
HOST_ONLY = tuple(os.path.join(*p) for p in (("telemetry", "stats.py"), ("sync", "statistics.py"),
                                               ("sync", "collectives.py"), ("sync", "host_values.py")))


TENSOR_METHODS = tuple(sorted(ALWAYS - {"count_nonzero_static", "allclose"})) + (
    "__getitem__", "__setitem__", "repeat_interleave")
TORCH_FUNCTIONS = ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "equal", "allclose",
                   "where", "repeat_interleave")


def _bool_index(idx: Any) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _syncs(name: str, args: tuple, kwargs: dict) -> bool:
    if name in ALWAYS:
        return True
    if name in ("__getitem__", "__setitem__"):
        return len(args) > 1 and _bool_index(args[1])      # a boolean mask's result size depends on the data
    if name == "where":
        return len(args) == 1 and not kwargs
    if name == "repeat_interleave":
        return "output_size" not in kwargs
    return False


def _site() -> Optional[str]:
    """``file:line`` of the innermost frame outside torch and this module, if it is ds_gravac's own code."""
    f = sys._getframe(2)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_TORCH_DIR) and fn != _THIS:
            if not fn.startswith(_DS_DIR):
                return None
            rel = fn[len(_DS_DIR):]
            return None if rel.endswith(HOST_ONLY) else f"{rel}:{f.f_lineno}"
        f = f.f_back
    return None


class SyncCounter:
    """Counts ds_gravac's synchronizing calls while active (``with SyncCounter() as c: ...; c.total``).

    The calls are patched on ``torch.Tensor`` and in ``torch`` itself rather than seen through a
    ``TorchFunctionMode``, because autograd runs the gradient hooks (where ds_gravac's step happens) without the
    caller's function modes."""

    def __init__(self) -> None:
        self.sites: collections.Counter[str] = collections.Counter()
        self._saved: list[tuple[Any, str, Any, bool]] = []

    def _wrap(self, owner: Any, name: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return
        own = name in vars(owner)
        counter = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _syncs(name, args, kwargs):
                site = _site()
                if site is not None:
                    counter.sites[f"{name} @ {site}"] += 1
            return orig(*args, **kwargs)

        self._saved.append((owner, name, orig, own))
        setattr(owner, name, wrapper)

    def __enter__(self) -> "SyncCounter":
        for name in TENSOR_METHODS:
            self._wrap(torch.Tensor, name)
        for name in TORCH_FUNCTIONS:
            self._wrap(torch, name)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, orig, own in reversed(self._saved):
            if own:
                setattr(owner, name, orig)
            else:
                delattr(owner, name)
        self._saved.clear()

    @property
    def total(self) -> int:
        return sum(self.sites.values())


# Host synchronizations one steady-state step may make on the device path, per compressor, for the check's model
# (ds_gravac_bench.device_check_train.Net: three compressible tensors, every one sent compressed). STATS is the
# one read every compressed step needs: the step's ‖x‖², gains and non-finite checks, read in one transfer
# right before the statistics exchange (sync/deferred.py), because the ranks must agree on a non-finite step
# before anything is committed. Beyond it, only payloads whose size depends on the data read a count per tensor.
STATS = 1
MEMBERS = 3
BUDGET: dict[str, int] = {
    "dense": 0,                         # mode "dense" checks nothing: DeepSpeed's own averaging, no statistics
    "gravac": STATS + MEMBERS,          # GraVAC over Top-k: probe gains ride on the statistics read; deriving the
                                        # higher levels from θ_min's payload reads its real entry count per tensor
    "none": STATS, "fp16": STATS, "bf16": STATS,
    "topk": STATS, "ef21": STATS,       # one stable sort per tensor: the canonical top-k without a host count
    "randomk": STATS,                   # the shared order: a sort by counter-based keys, no count of distinct draws
    "powersgd": STATS, "acpsgd": STATS,
    "onebit": STATS, "signsgd": STATS, "efsignsgd": STATS, "terngrad": STATS, "ternary": STATS,
    "qsgd": STATS, "tbq": STATS,        # incl. the parameter-server exchange: static sizes, counter-based draws
    "threshold": STATS + MEMBERS,       # |x| ≥ τ: the number of entries sent is the data's, read per tensor
    "graddrop": STATS + 3 * MEMBERS,    # sampled threshold (its k-th sample value) and the candidates' count
    "dgc": STATS + 14,                  # each gathered row's real entry count, read by the decode
    "redsync": STATS + 20,              # mean, max, and a count per bisection step (≤ max_iters, data-dependent)
    "sidco": STATS + 24,                # fitted-threshold stages: the exceedances and their statistics per stage
    # mode auto: the per-group error signals of the last step (PowerSGD's prefix energies and samples, QSGD's
    # variance terms, Top-k's sampled residuals) stay on the device and are read in one transfer beside STATS
    "auto_powersgd": STATS + 1, "auto_qsgd": STATS + 1, "auto_topk": STATS + 1,
}

__all__ = ["SyncCounter", "ALWAYS", "HOST_ONLY", "BUDGET", "STATS"]
