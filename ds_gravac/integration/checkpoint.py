"""Checkpoints: replicated state (controller, bucket order, config) in DeepSpeed's client_state, written by rank 0,
and per-rank state (error-feedback memory) in ``gravac_rank{r:05d}.pt`` next to it, with a copy of the replicated
part. Never in ``optimizer.state``: with ZeRO-0 every rank loads rank 0's optimizer state, which would overwrite
the per-rank memory.

Loading says what differs from the running setup: another package version or ``"gravac"`` section (the keys are
named), another world size (``checkpoint.on_world_size_change``: reset the per-rank memory with a warning, or
raise), another compressor (its memory is reset). Nothing measured before the load survives it: the timing and
statistics of the step that was running are dropped.
"""
from __future__ import annotations

import logging
import os
from types import MethodType
from typing import Any, ContextManager, Mapping, Optional, Protocol

import torch
import torch.distributed as tdist

from ..adapt.base import Controller
from ..compress.base import Compressor
from ..config import SPARSIFIER_CF, GravacConfig, parse_config
from ..errors import GravacConfigError, GravacError
from ..sync.synchronizer import Synchronizer
from .. import version

logger = logging.getLogger("ds_gravac")
FORMAT = 2
CLIENT_KEY = "gravac"


class CheckpointedHandle(Protocol):
    """What checkpointing reads of a handle (``engine.GravacHandle``; a protocol, so this module does not import
    the one that routes the engine's checkpoint calls here)."""

    engine: Any                        # a DeepSpeed engine
    config: GravacConfig
    compressor: Optional[Compressor]
    controller: Optional[Controller]
    sync: Optional[Synchronizer]
    routed_checkpoint_attributes: dict[str, Any]

    def engine_settings(self) -> ContextManager[None]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"gravac_rank{rank:05d}.pt")


def _version() -> str:
    """Read when called, not at import (a test stands in an older writer by setting ``ds_gravac.version``)."""
    return version.__version__


def handle_state(handle: CheckpointedHandle) -> dict[str, Any]:
    """``{"replicated": ..., "local": ...}`` of an attached handle."""
    sync, comp = handle.sync, handle.compressor
    if sync is None:
        return {"replicated": {}, "local": {}}
    sync.drain()
    comp_state = comp.state_dict()
    sync_state = sync.state_dict()
    replicated = {"format": FORMAT, "version": _version(), "controller": handle.controller.state_dict(),
                  "bucket_order": sync_state["bucket_order"], "layout_signature": sync_state["layout_signature"],
                  "step": int(handle.engine.global_steps), "config_hash": handle.config.config_hash(),
                  "config": handle.config.normalized(), "compressor": comp_state.get("replicated", {}),
                  "compressor_type": handle.config.compressor.type, "world_size": sync.world_size}
    local = {"format": FORMAT, "version": _version(), "rank": sync.rank, "world_size": sync.world_size,
             "memory": sync_state["memory"], "server_residuals": sync_state["server_residuals"],
             "aggregate_gain": sync_state["aggregate_gain"],
             "compressor_state": comp_state.get("local", {}),
             "compressor_type": handle.config.compressor.type, "global_steps": int(handle.engine.global_steps)}
    return {"replicated": replicated, "local": local}


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two normalized ``"gravac"`` sections."""
    out: list[str] = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out.extend(config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out.append(f"{prefix}{key} ({a!r} -> {b!r})")
    return out


def _current_form(saved: Any) -> Optional[dict[str, Any]]:
    """A checkpoint's saved section in this version's key names (an older writer's renamed keys moved, no
    warning: the user did not write them), or None when it is not a valid section any more."""
    if not isinstance(saved, Mapping):
        return None
    if "gravac" not in saved and saved.get("cf") == SPARSIFIER_CF:
        saved = {k: v for k, v in saved.items() if k != "cf"}    # before 0.5 an unset cf was written as 100
    try:
        return parse_config(saved, warn=False).normalized()
    except GravacConfigError:
        return dict(saved)


def _report_differences(handle: CheckpointedHandle, rep: Mapping[str, Any]) -> None:
    version = rep.get("version")
    if version is not None and version != _version():
        logger.warning("ds_gravac: checkpoint written by ds_gravac %s, this is %s", version, _version())
    if rep.get("config_hash") is not None and rep["config_hash"] != handle.config.config_hash():
        saved = _current_form(rep.get("config"))
        diffs = config_differences(saved, handle.config.normalized()) if saved is not None else []
        logger.warning("ds_gravac: the checkpoint was written with a different 'gravac' section%s",
                       ": " + "; ".join(diffs) if diffs else "")


def check_world_size(handle: CheckpointedHandle, state: Mapping[str, Any], world_size: int) -> bool:
    """Whether the per-rank state was written at this world size; applies ``on_world_size_change``."""
    rep, local = state.get("replicated") or {}, state.get("local") or {}
    old = local.get("world_size", rep.get("world_size"))
    if old is None or int(old) == world_size:
        return True
    if handle.config.checkpoint.on_world_size_change == "error":
        raise GravacError(f"ds_gravac: checkpoint was written with world_size={old}, now {world_size} "
                          f"(checkpoint.on_world_size_change is 'error')")
    logger.warning("ds_gravac: checkpoint was written with world_size=%s, now %d: error-feedback residuals "
                   "reset to zero (controller state kept)", old, world_size)
    return False


def load_handle_state(handle: CheckpointedHandle, state: Mapping[str, Any]) -> None:
    """Restore replicated state exactly; per-rank state only when world size, format and compressor match."""
    rep, local = state.get("replicated") or {}, state.get("local") or {}
    sync = handle.sync
    if sync is None:
        return
    _report_differences(handle, rep)
    same_world = check_world_size(handle, state, sync.world_size)
    if rep.get("controller") is not None:
        handle.controller.load_state_dict(rep["controller"])
    same_compressor = local.get("compressor_type", handle.config.compressor.type) == handle.config.compressor.type
    if local and same_world and not same_compressor:
        logger.warning("ds_gravac: the checkpoint's compressor was '%s', now '%s': its memory is reset",
                       local.get("compressor_type"), handle.config.compressor.type)
    if local and local.get("format") != FORMAT:
        logger.warning("ds_gravac: per-rank checkpoint format %s (this version writes %s): error-feedback memory "
                       "starts at zero", local.get("format"), FORMAT)
    usable = bool(local) and same_world and same_compressor and local.get("format") == FORMAT
    handle.compressor.load_state_dict({"replicated": rep.get("compressor", {}),
                                       "local": local.get("compressor_state", {}) if usable else {}},
                                      world_size_changed=not usable)
    sync.load_state_dict({"bucket_order": rep.get("bucket_order"), "memory": local.get("memory"),
                          "server_residuals": local.get("server_residuals"),
                          "aggregate_gain": local.get("aggregate_gain")}, memory=usable)


def save_checkpoint(handle: CheckpointedHandle, save_dir: str, tag: Optional[str], client_state: Optional[dict],
                    *ds_args: Any, **ds_kwargs: Any) -> Any:
    """DeepSpeed checkpoint with our replicated state, then per-rank files (tmp + os.replace), then barrier."""
    state = handle.state_dict()
    client = dict(client_state or {})
    client[CLIENT_KEY] = state["replicated"]
    with handle.engine_settings():        # DGC: the engine's momentum and clipping, not the zeros while attached
        result = deepspeed_method(handle, "save_checkpoint")(save_dir, tag, client, *ds_args, **ds_kwargs)
    if handle.config.checkpoint.per_rank_files and handle.sync is not None:
        tag = tag if tag is not None else f"global_step{handle.engine.global_steps}"
        write_rank_file(os.path.join(save_dir, str(tag)), state)
    return result


def write_rank_file(directory: str, state: Mapping[str, Any]) -> str:
    rank = state["local"]["rank"]
    os.makedirs(directory, exist_ok=True)
    path = rank_file(directory, rank)
    payload = dict(state["local"])
    payload["replicated"] = state["replicated"]
    tmp = path + ".tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)
    if tdist.is_initialized():
        tdist.barrier()
    return path


def read_rank_file(directory: str, rank: int) -> Optional[dict[str, Any]]:
    path = rank_file(directory, rank)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def load_checkpoint(handle: CheckpointedHandle, load_dir: str, tag: Optional[str], *ds_args: Any, **ds_kwargs: Any) -> Any:
    """DeepSpeed load, then our replicated state (client_state, else the per-rank copy), then per-rank state.

    A passive handle (world size 1) restores nothing, but still applies ``on_world_size_change`` to a
    checkpoint that holds ds_gravac state of a larger run, so that state is never dropped silently."""
    with handle.engine_settings():        # DGC: takes momentum and clipping over again from what was loaded
        load_path, client_state = deepspeed_method(handle, "load_checkpoint")(load_dir, tag, *ds_args, **ds_kwargs)
    if load_path is None:
        return load_path, client_state
    rank = handle.sync.rank if handle.sync is not None else 0
    per_rank = (read_rank_file(os.path.dirname(load_path), rank) if handle.config.checkpoint.per_rank_files
        else None)
    replicated = (client_state or {}).pop(CLIENT_KEY, None)
    if replicated is None and per_rank is not None:
        replicated = per_rank.get("replicated")
    if handle.sync is None:
        if replicated or per_rank:
            if check_world_size(handle, {"replicated": replicated or {}, "local": per_rank or {}}, 1):
                logger.warning("ds_gravac: world size 1: ds_gravac is passive, the checkpoint's ds_gravac state "
                               "is not used")
        return load_path, client_state
    if replicated is None:
        logger.warning("ds_gravac: no ds_gravac state in checkpoint; controller starts fresh")
    if per_rank is None:
        logger.warning("ds_gravac: [rank %d] no per-rank ds_gravac file in %s: residuals start at zero", rank,
                       os.path.dirname(load_path))
    handle.load_state_dict({"replicated": replicated or {}, "local": per_rank or {}})
    return load_path, client_state


# ---- unmodified scripts: engine.save_checkpoint / load_checkpoint go through the handle ----------------------
ROUTED = ("save_checkpoint", "load_checkpoint")


def route_engine_checkpoints(handle: CheckpointedHandle) -> None:
    """While attached, ``engine.save_checkpoint`` / ``load_checkpoint`` are the handle's, so a DeepSpeed script
    that knows nothing of ds_gravac (or the Hugging Face Trainer, which calls the engine's) saves and restores the
    residuals and controller state, and records the engine's own momentum and clipping rather than the zeros DGC
    leaves in the optimizer. DeepSpeed's methods are kept and called underneath; :func:`unroute_engine_checkpoints`
    puts them back."""
    engine = handle.engine
    # what detach puts back: an instance attribute the engine had before attach, or None (the class's method)
    handle.routed_checkpoint_attributes = {name: engine.__dict__.get(name) for name in ROUTED}

    def save(save_dir: str, tag: Optional[str] = None, client_state: Optional[dict] = None, *args: Any,
             **kwargs: Any) -> Any:
        return save_checkpoint(handle, save_dir, tag, client_state, *args, **kwargs)

    def load(load_dir: str, tag: Optional[str] = None, *args: Any, **kwargs: Any) -> Any:
        return load_checkpoint(handle, load_dir, tag, *args, **kwargs)

    engine.save_checkpoint, engine.load_checkpoint = save, load


def unroute_engine_checkpoints(handle: CheckpointedHandle) -> None:
    """DeepSpeed's own methods back on the engine (at detach)."""
    engine = handle.engine
    for name, own in (getattr(handle, "routed_checkpoint_attributes", None) or {}).items():
        if own is not None:
            setattr(engine, name, own)                  # an instance attribute set before attach, as it was
        else:
            engine.__dict__.pop(name, None)             # the class's method shows through again
    handle.routed_checkpoint_attributes = {}


def deepspeed_method(handle: CheckpointedHandle, name: str) -> Any:
    """DeepSpeed's ``save_checkpoint`` / ``load_checkpoint`` of the handle's engine, never the routed one."""
    engine, routed = handle.engine, getattr(handle, "routed_checkpoint_attributes", None) or {}
    if name not in routed:
        return getattr(engine, name)
    own = routed[name]
    return own if own is not None else MethodType(getattr(type(engine), name), engine)
