"""The check ``ds_gravac.initialize`` runs before ``deepspeed.initialize``: DeepSpeed broadcasts every parameter
from rank 0 while it builds the engine, so ranks whose models differ would fail inside that broadcast (a raw gloo
size mismatch, or a hang on an extra parameter) or, for a parameter frozen on one rank only, pass it silently."""
from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any, Callable

from .agreement import agree_parameters


def check_models_before_broadcast(ds_initialize: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Bring up ``deepspeed.comm`` exactly as ``deepspeed.initialize`` would, then agree on the parameter list."""
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator

    try:
        bound = inspect.signature(ds_initialize).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return            # DeepSpeed reports its own argument errors
    model = bound.get("model")
    if model is None or not hasattr(model, "named_parameters"):
        return
    defaults = {k: v.default for k, v in inspect.signature(ds_initialize).parameters.items()}
    dist.init_distributed(dist_backend=get_accelerator().communication_backend_name(),
                          distributed_port=bound.get("distributed_port", defaults.get("distributed_port")),
                          dist_init_required=bound.get("dist_init_required", defaults.get("dist_init_required")))
    if dist.get_world_size() > 1:
        agree_parameters(model.named_parameters())


def declares_gravac(ds_initialize: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether the DeepSpeed config given to ``deepspeed.initialize`` has a ``"gravac"`` section, read before the
    engine exists (a dict, a JSON path, or ``args.deepspeed_config``); True when it cannot be told."""
    try:
        bound = inspect.signature(ds_initialize).bind_partial(*args, **kwargs).arguments
    except TypeError:
        return True
    config = bound.get("config") or bound.get("config_params")
    if config is None and bound.get("args") is not None:
        config = getattr(bound["args"], "deepspeed_config", None) or getattr(bound["args"], "deepscale_config", None)
    if isinstance(config, Mapping):
        return "gravac" in config
    if isinstance(config, str):
        try:
            with open(config) as f:
                return "gravac" in json.load(f)
        except (OSError, ValueError):
            return True
    return True
