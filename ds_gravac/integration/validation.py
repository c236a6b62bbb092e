"""The support matrix: reject what ds_gravac cannot take over, before touching the engine."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import unsupported
from .zero import validate_zero, zero_stage


def _call(engine: Any, name: str, default: Any = None) -> Any:
    attr = getattr(engine, name, None)
    if attr is None:
        return default
    return attr() if callable(attr) else attr


def validate_engine(engine: Any) -> None:
    """Raise :class:`~ds_gravac.errors.GravacUnsupportedError` naming the first unsupported setting (fixed order)."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    validate_zero(engine)
    if _call(engine, "fp16_enabled", False) and zero_stage(engine) == 0:
        unsupported("fp16 with zero_optimization.stage 0 is not supported: DeepSpeed 0.19.8 does not scale the loss "
                    "with ZeRO-0 fp16 but unscales in step() (deepspeedai/DeepSpeed#8393); use bf16 or fp32, or fp16 "
                    "with ZeRO stage 1 or 2")
    if _call(engine, "torch_autocast_enabled", False) and _call(engine, "torch_autocast_dtype") == torch.float16:
        unsupported("torch_autocast with float16 uses a GradScaler whose changing scale corrupts error-feedback "
                    "residuals; use bfloat16")
    if isinstance(engine, PipelineEngine):
        unsupported("pipeline parallelism is not supported")
    if getattr(engine, "has_moe_layers", False):
        unsupported("MoE layers are not supported")
    world = torch.distributed.get_world_size()
    mp = getattr(engine, "mp_world_size", 1) or 1
    autotp = _call(engine, "autotp_size", 0) or 0
    sp = getattr(engine, "sequence_parallel_size", 1) or 1
    dp = getattr(engine, "seq_dp_world_size", world) or world
    if mp > 1 or autotp > 1 or sp > 1 or dp != world:
        unsupported("model/sequence parallelism is not supported (data parallelism only)")
    zenflow = getattr(getattr(getattr(engine, "_config", None), "zero_config", None), "zenflow", None)
    if _call(engine, "is_deepcompile_enabled", False) or zenflow is not None:
        unsupported("DeepCompile/ZenFlow are not supported")
    if not _call(engine, "managed_gradient_accumulation", True):
        unsupported("managed_gradient_accumulation is false: the accumulation boundary is only visible inside step(); "
                    "remove the key")
    for name, module in engine.module.named_modules():
        if (isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse
                and module.weight.requires_grad):
            unsupported(f"sparse gradients are not supported: module '{name}' is {type(module).__name__}(sparse=True); "
                        f"construct it with sparse=False (its gradient is then a dense tensor ds_gravac can exchange)")
