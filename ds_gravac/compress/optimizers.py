"""What compressors may learn about the engine's optimizer: its wrapper chain and each parameter's live group.

Several compressors depend on the optimizer: DGC applies momentum itself and needs plain SGD underneath,
EF-signSGD sends updates and needs each parameter's current learning rate. DeepSpeed wraps the optimizer it
builds (the bf16 and fp16 optimizers keep fp32 master copies and rewrite the wrapped optimizer's groups to hold
those; ZeRO-1/2 holds flat partitions of them), so both questions need the same unwrapping, kept here once.
"""
from __future__ import annotations

from typing import Any, Optional

# Attributes of DeepSpeed's precision wrappers that list the model's parameters of each optimizer group, in the
# order of the wrapped optimizer's ``param_groups`` (whose ``params`` hold master copies instead).
WRAPPED_GROUPS = ("bf16_groups", "fp16_groups", "bit16_groups")      # the last: ZeRO-1/2's optimizer


def optimizer_chain(engine: Any) -> list[Any]:
    """The engine's optimizer objects, outermost first (DeepSpeed wraps the basic one under bf16/fp16)."""
    chain: list[Any] = []
    for start in (getattr(engine, "basic_optimizer", None), getattr(engine, "optimizer", None)):
        opt, depth = start, 0
        while opt is not None and depth < 4 and all(opt is not c for c in chain):
            chain.append(opt)
            opt, depth = getattr(opt, "optimizer", None), depth + 1
    return chain


def find_optimizer(engine: Any, cls: type) -> Optional[Any]:
    """The first optimizer of the chain that is an instance of ``cls`` (e.g. ``torch.optim.SGD``), or None."""
    return next((o for o in optimizer_chain(engine) if isinstance(o, cls)), None)


def live_param_groups(engine: Any) -> dict[int, dict[str, Any]]:
    """``id(parameter) → its optimizer param group`` — the live dict a scheduler updates, not a copy — for the
    module's own parameters, also when a precision wrapper replaced the groups' ``params`` by master copies."""
    groups: dict[int, dict[str, Any]] = {}
    basic = getattr(engine, "basic_optimizer", None) or getattr(engine, "optimizer", None)
    param_groups = list(getattr(basic, "param_groups", None) or [])
    for group in param_groups:
        for p in group["params"]:
            groups[id(p)] = group
    for opt in optimizer_chain(engine):
        for attr in WRAPPED_GROUPS:
            lists = getattr(opt, attr, None)
            if isinstance(lists, (list, tuple)) and len(lists) == len(param_groups):
                for group, params in zip(param_groups, lists):
                    for p in params:
                        groups[id(p)] = group
    return groups


__all__ = ["optimizer_chain", "find_optimizer", "live_param_groups"]
