"""The training part of the device check: every compressor family trains a small model on real ranks for a few
steps on the device's tensors, ``mode: "dense"`` is compared bitwise with DeepSpeed's own path, and the host
synchronizations of steady-state steps are counted on the path a GPU takes (``device_check_syncs``).

``job`` runs inside each rank (``torch.distributed`` already initialized, e.g. by ``deepspeed.init_distributed``);
it returns plain values only, so a harness can pickle them back.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Optional

import torch
from torch import nn

from ds_gravac.compress.device_path import force_device_path
from .device_check_syncs import SyncCounter

# one config per registered compressor, grouped by family; small CFs so every bucket is sent compressed
FAMILIES: dict[str, dict[str, dict[str, Any]]] = {
    "dense": {"dense": {"mode": "dense"}, "none": {"compressor": "none"}},
    "cast": {"fp16": {"compressor": "fp16"}, "bf16": {"compressor": "bf16"}},
    "sparsifier": {"topk": {"cf": 20}, "ef21": {"cf": 20}, "randomk": {"cf": 20},
                   "dgc": {"cf": 20, "min_compress_numel": 0,
                           "compressor": {"type": "dgc", "params": {"momentum": 0.9}}},
                   "redsync": {"cf": 20}, "sidco": {"cf": 20},
                   "threshold": {"compressor": {"type": "threshold", "params": {"tau": 0.001}}},
                   "graddrop": {"cf": 20}},
    "lowrank": {"powersgd": {"compressor": {"type": "powersgd", "params": {"rank": 4}}},
                "acpsgd": {"compressor": {"type": "acpsgd", "params": {"rank": 4}}}},
    "quantizer": {"onebit": {}, "signsgd": {}, "efsignsgd": {}, "terngrad": {}, "ternary": {}, "qsgd": {},
                  "tbq": {}},
    # GraVAC over Top-k: multi-level probes every step, so every gain numerator goes through the statistics read
    "controller": {"gravac": {"mode": "gravac", "compressor": "topk",
                              "gravac": {"theta_min": 4, "theta_max": 32}},
                   # auto over each family it drives: a decision every step on a slow nominal link (compressed plans;
                   # fp32 dense, against which rank 16 of these 67-wide layers pays, where bf16 dense would not)
                   **{f"auto_{c}": {"mode": "auto", "compressor": c,
                                    "auto": {"interval_steps": 1, "warmup_steps": 0, "link": "nominal",
                                             "link_gbit_s": 0.001,
                                             "pin_below_numel": 0, "detector_eta": None, "budget_tight": 1.0,
                                             "dense_dtype": "engine"}}
                      for c in ("powersgd", "qsgd", "topk")}},
}
MODES = ("dense", "gravac", "auto_powersgd", "auto_qsgd", "auto_topk")   # rows that are modes, not compressors
PS = {"quantized_exchange": "ps"}      # the parameter-server exchange, also with two ranks


def family_of(name: str) -> str:
    return next(f for f, members in FAMILIES.items() if name in members)


def gravac_section(name: str) -> dict[str, Any]:
    extra = copy.deepcopy(FAMILIES[family_of(name)][name])
    base = {"mode": "static", "compressor": name, "bucket_cap_mb": 0.01, "min_compress_numel": 256,
            "log_interval": 0, "gain_interval": 0}
    if family_of(name) == "quantizer":
        base.update(PS)
    if extra.get("mode") == "dense":
        del base["compressor"]
    base.update(extra)
    return base


class Net(nn.Module):
    """Odd widths (no tensor a multiple of 8), several buckets at a 10 KB cap."""

    def __init__(self, width: int = 67) -> None:
        super().__init__()
        self.inp = nn.Linear(29, width)
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, 11)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(torch.relu(self.inp(x)))))


def ds_config(gravac: Optional[dict], world: int, bf16: bool, micro: int = 8) -> dict[str, Any]:
    cfg: dict[str, Any] = {"train_batch_size": micro * world, "train_micro_batch_size_per_gpu": micro,
                           "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
                           "zero_optimization": {"stage": 0},
                           "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}},
                           "steps_per_print": 10**9, "wall_clock_breakdown": False}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if gravac is not None:
        cfg["gravac"] = gravac
    return cfg


def _batch(rank: int, step: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1009 * rank + step)
    return torch.randn(8, 29, generator=g).to(device, dtype), torch.randint(0, 11, (8,), generator=g).to(device)


def train(name: Optional[str], rank: int, world: int, device: torch.device, steps: int, count_from: int,
          bf16: bool = False) -> dict[str, Any]:
    """Train ``steps`` steps with compressor ``name`` (None: DeepSpeed's own path) on ``device``; the steps from
    ``count_from`` on are counted (one :class:`SyncCounter` per step, the most any step made is reported)."""
    import deepspeed

    import ds_gravac
    torch.manual_seed(0)
    model = Net().to(device)
    cfg = ds_config(None if name is None else gravac_section(name), world, bf16)
    init = deepspeed.initialize if name is None else ds_gravac.initialize
    engine, *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
    dtype = torch.bfloat16 if bf16 else torch.float32
    per_step, cuda_per_step, sites, losses = [], [], {}, []
    for s in range(steps):
        x, y = _batch(rank, s, device, dtype)
        counter, counting = SyncCounter(), s >= count_from
        with counter if counting else _Null(), CudaSyncs(device if counting else None) as cuda_syncs:
            loss = nn.functional.cross_entropy(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
        losses.append(float(loss.detach()))
        if counting:
            per_step.append(counter.total)
            cuda_per_step.append(cuda_syncs.count)
            for k, v in counter.sites.items():
                sites[k] = max(sites.get(k, 0), v)
    handle = ds_gravac.get_handle(engine)
    stats = handle.last_stats() if handle is not None else {}
    params = {n: p.detach().float().cpu().clone() for n, p in engine.module.named_parameters()}
    return {"params": params, "losses": losses, "syncs_per_step": max(per_step, default=0), "sync_sites": sites,
            "cuda_syncs_per_step": max(cuda_per_step) if device.type == "cuda" and cuda_per_step else None,
            "branch": stats.get("branch"), "bytes_sent": stats.get("bytes_sent"),
            "dense_bytes": stats.get("dense_bytes")}


class CudaSyncs:
    """On CUDA, the device's own count: ``torch.cuda.set_sync_debug_mode("warn")`` warns at every synchronizing
    call of the step (DeepSpeed's included), and the warnings are counted; elsewhere a no-op."""

    def __init__(self, device: Optional[torch.device]) -> None:
        self.on = device is not None and device.type == "cuda"
        self.count = 0

    def __enter__(self) -> "CudaSyncs":
        if self.on:
            self._catch = warnings.catch_warnings(record=True)
            self._log = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.on:
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum("synchroniz" in str(w.message) for w in self._log)
            self._catch.__exit__(*exc)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def job(rank: int, world: int, device: str, names: list[str], steps: int, count_from: int,
        device_path: bool = True) -> dict[str, Any]:
    """Every compressor of ``names`` (and DeepSpeed's own path, for the dense parity) on this rank of ``device``."""
    dev = torch.device(device if device != "cuda" else f"cuda:{rank % max(1, torch.cuda.device_count())}")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    out: dict[str, Any] = {}
    with force_device_path(device_path):
        for name in ["deepspeed"] + names:
            try:
                out[name] = train(None if name == "deepspeed" else name, rank, world, dev, steps, count_from)
            except Exception as exc:     # one family's failure is a row of the report, not the end of the check
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def all_names() -> list[str]:
    return [n for members in FAMILIES.values() for n in members]
