"""Checkpoints (deepspeed.md §7): replicated state in DeepSpeed's client_state (written by rank 0), per-rank
state (residuals, compressor memory) in ``gravac_rank{r:05d}.pt`` next to it. Never in ``optimizer.state``:
with ZeRO-0 every rank loads rank 0's optimizer state, which would overwrite per-rank residuals."""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

import torch
import torch.distributed as tdist

from ..errors import GravacError

logger = logging.getLogger("ds_gravac")
FORMAT = 1
CLIENT_KEY = "gravac"


def rank_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"gravac_rank{rank:05d}.pt")


def handle_state(handle: Any) -> dict[str, Any]:
    """``{"replicated": ..., "local": ...}`` of an attached handle."""
    sync, comp = handle.sync, handle.compressor
    if sync is None:
        return {"replicated": {}, "local": {}}
    sync.drain()
    comp_state = comp.state_dict()
    replicated = {"format": FORMAT, "controller": handle.controller.state_dict(),
                  "bucket_order": list(sync.plan.order) if sync.plan.frozen else None,
                  "layout_signature": sync.plan.layout_signature(), "step": int(handle.engine.global_steps),
                  "config_hash": handle.config.config_hash(), "compressor": comp_state.get("replicated", {}),
                  "compressor_type": handle.config.compressor.type, "world_size": sync.world_size}
    residuals = {b: cb.residual.clone() for b, cb in sync.cbuckets.items() if cb.residual is not None}
    local = {"format": FORMAT, "rank": sync.rank, "world_size": sync.world_size,
             "layout_signature": replicated["layout_signature"], "residuals": residuals,
             "compressor_state": comp_state.get("local", {}), "compressor_type": handle.config.compressor.type,
             "global_steps": int(handle.engine.global_steps)}
    return {"replicated": replicated, "local": local}


def load_handle_state(handle: Any, state: Mapping[str, Any]) -> None:
    """Restore replicated state exactly; local state only when world size, layout and compressor match."""
    rep, local = state.get("replicated") or {}, state.get("local") or {}
    sync = handle.sync
    if sync is None:
        return
    order = rep.get("bucket_order")
    if order is not None and (not sync.plan.frozen or list(sync.plan.order) != list(order)):
        sync._build_plan([int(i) for i in order], frozen=True)
    if rep.get("controller") is not None:
        handle.controller.load_state_dict(rep["controller"])
    old = local.get("world_size", rep.get("world_size", sync.world_size))
    world_changed = int(old) != sync.world_size
    if world_changed:
        if handle.config.checkpoint.on_world_size_change == "error":
            raise GravacError(f"ds_gravac: checkpoint was written with world_size={old}, now {sync.world_size} "
                              f"(checkpoint.on_world_size_change is 'error')")
        logger.warning("ds_gravac: checkpoint was written with world_size=%s, now %d: error-feedback residuals "
                       "reset to zero (controller state kept)", old, sync.world_size)
    layout_ok = local.get("layout_signature") == sync.plan.layout_signature() \
        and local.get("compressor_type", handle.config.compressor.type) == handle.config.compressor.type
    if local and not layout_ok and not world_changed:
        logger.warning("ds_gravac: bucket layout or compressor changed since the checkpoint: residuals reset")
    usable = bool(local) and layout_ok and not world_changed
    handle.compressor.load_state_dict({"replicated": rep.get("compressor", {}),
                                       "local": local.get("compressor_state", {}) if usable else {}},
                                      world_size_changed=not usable)
    sync.reset_memory()
    if usable:
        for b, tensor in local.get("residuals", {}).items():
            cb = sync.cbuckets.get(int(b))
            if cb is not None and cb.residual is not None and cb.residual.shape == tensor.shape:
                cb.residual.copy_(tensor)


def save_checkpoint(handle: Any, save_dir: str, tag: Optional[str], client_state: Optional[dict],
                    **ds_kwargs: Any) -> Any:
    """DeepSpeed checkpoint with our replicated state, then per-rank files (tmp + os.replace), then barrier."""
    state = handle.state_dict()
    client = dict(client_state or {})
    client[CLIENT_KEY] = state["replicated"]
    result = handle.engine.save_checkpoint(save_dir, tag=tag, client_state=client, **ds_kwargs)
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
    from .. import __version__
    payload["version"] = __version__
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


def load_checkpoint(handle: Any, load_dir: str, tag: Optional[str], **ds_kwargs: Any) -> Any:
    """DeepSpeed load, then our replicated state (client_state, else the per-rank copy), then per-rank state."""
    load_path, client_state = handle.engine.load_checkpoint(load_dir, tag=tag, **ds_kwargs)
    if load_path is None or handle.sync is None:
        return load_path, client_state
    rank = handle.sync.rank
    per_rank = read_rank_file(os.path.dirname(load_path), rank) if handle.config.checkpoint.per_rank_files \
        else None
    replicated = (client_state or {}).pop(CLIENT_KEY, None)
    if replicated is None and per_rank is not None:
        replicated = per_rank.get("replicated")
    if replicated is None:
        logger.warning("ds_gravac: no ds_gravac state in checkpoint; controller starts fresh")
    if per_rank is None:
        logger.warning("ds_gravac: [rank %d] no per-rank ds_gravac file in %s: residuals start at zero", rank,
                       os.path.dirname(load_path))
    handle.load_state_dict({"replicated": replicated or {}, "local": per_rank or {}})
    return load_path, client_state
