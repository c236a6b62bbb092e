"""When each gradient is ready during backward, from the model's FLOPs (meta device, no data, no timing).

The synchronizer launches a bucket's exchange as soon as its last gradient is ready, so communication overlaps the
rest of backward. How much of backward is left then is a property of the model, not of the machine: backward runs
the leaf modules in the reverse of their forward order, and a module's parameter gradients are ready once its own
backward is done. Counting each module's backward FLOPs (``torch.utils.flop_counter``: convolutions and matrix
products; normalization and activations count zero) gives, per parameter, the fraction of backward done when its
gradient is ready, and the backward's share of the step's FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class BackwardProfile:
    """``ready[name]``: fraction of backward FLOPs done when parameter ``name``'s gradient is ready;
    ``share``: backward FLOPs / (forward + backward FLOPs)."""

    ready: dict[str, float]
    share: float


def _per_module(counts: dict[str, dict]) -> dict[str, float]:
    """FLOPs per module path, ``FlopCounterMode``'s names (the root class name, then the module path)."""
    return {name: float(sum(ops.values())) for name, ops in counts.items()}


def backward_profile(net: torch.nn.Module, example: torch.Tensor) -> BackwardProfile:
    """Profile ``net`` on ``example`` (both on the meta device is enough)."""
    order: list[str] = []
    leaves = {name: m for name, m in net.named_modules() if not list(m.children())}
    hooks = [m.register_forward_hook(lambda mod, i, o, name=name: order.append(name)) for name, m in leaves.items()]
    try:
        with FlopCounterMode(display=False) as fwd:
            net(example)
    finally:
        for h in hooks:
            h.remove()
    with FlopCounterMode(display=False) as both:
        net(example).float().sum().backward()
    root = type(net).__name__
    forward, total = _per_module(fwd.get_flop_counts()), _per_module(both.get_flop_counts())

    def flops(table: dict[str, float], leaf: str) -> float:
        return table.get(f"{root}.{leaf}", 0.0)

    first_call = list(dict.fromkeys(order))          # a module called twice (a shared ReLU) counts at its first call
    backward = {leaf: max(0.0, flops(total, leaf) - flops(forward, leaf)) for leaf in first_call}
    total_bwd = sum(backward.values())
    done, ready_module = 0.0, {}
    for leaf in reversed(first_call):
        done += backward[leaf]
        ready_module[leaf] = done / total_bwd if total_bwd > 0 else 1.0
    ready = {}
    for leaf, module in leaves.items():
        for pname, _ in module.named_parameters(recurse=False):
            ready[f"{leaf}.{pname}" if leaf else pname] = ready_module.get(leaf, 1.0)
    all_fwd = sum(forward.get(f"{root}.{leaf}", 0.0) for leaf in first_call)
    share = total_bwd / (total_bwd + all_fwd) if total_bwd + all_fwd > 0 else 0.0
    return BackwardProfile(ready=ready, share=share)
