"""The four training systems behind one small interface, so the loop in :mod:`runners.loop` never branches on
which one runs (every system gets the same model init, data order and optimizer).

* ``gravac``       – ``ds_gravac.initialize`` on the config (its ``"gravac"`` section drives compression);
* ``deepspeed``    – plain ``deepspeed.initialize`` on the same config without the ``"gravac"`` section;
* ``ddp``          – torch DDP (gloo on CPU, 25 MB buckets), optimizer and LR schedule built from the config;
* ``local``        – one rank, no wrapper and no communication: the compute-only step the benchmark's physical
  bound needs;
* ``local_engine`` – one rank through a DeepSpeed engine with its gradient all-reduce off: the compute-only step
  including the engine's own per-step work, which every DeepSpeed and ds_gravac step also does;
* ``ddp_powersgd`` – the same plus torch's ``powerSGD_hook`` (rank ``--powersgd-rank``, default 4, start at
  iteration 10), serialized bucket by bucket so it runs on gloo (:mod:`runners.ddp_hooks`);
* ``ddp_bf16``     – DDP plus torch's ``bf16_compress_hook``;
* ``ddp_localsgd`` – torch's post-local SGD: ``post_localSGD_hook`` and ``PostLocalSGDOptimizer`` with a
  ``PeriodicModelAverager`` (``--localsgd-period``, ``--localsgd-start``; :mod:`runners.ddp_comm`).

DeepSpeed's ``"communication_data_type": "fp16"``/``"bf16"`` needs no system of its own: ``deepspeed`` on a config
that sets it (its bytes are counted at that width).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
from typing import Any, Callable, ContextManager, Optional

import torch
from torch import nn

from .common import DistInfo, RunnerError, without_gravac
from .ddp_comm import CommScheme, PowerSGD, scheme_for
from .ds_optim import build_optimizer, build_scheduler
from .grad_jitter import jitter_gradients_
from .schedule import scheduler_factory

DDP_BUCKET_CAP_MB = 25
DEEPSPEED_CLIP_DEFAULT = 1.0     # GRADIENT_CLIPPING_DEFAULT in DeepSpeed 0.19.8


def dense_ring_bytes(module: nn.Module, world_size: int) -> float:
    """Logical bytes one rank sends in a ring all-reduce of all fp32 gradients: 2(N-1)/N of their bytes."""
    numel = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return 2.0 * (world_size - 1) / world_size * 4 * numel


class System:
    """What the loop needs from a training system. Checkpoints return DeepSpeed's ``(load_path, client_state)``."""

    name = "base"
    module: nn.Module
    device: torch.device

    def forward(self, *inputs: Any) -> Any:
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def sync_context(self) -> ContextManager[Any]:
        """Wraps forward+backward of one micro-batch (DDP needs ``no_sync`` off the accumulation boundary)."""
        return contextlib.nullcontext()

    @property
    def global_steps(self) -> int:
        raise NotImplementedError

    def lr(self) -> float:
        raise NotImplementedError

    def gradient_clipping(self) -> float:
        raise NotImplementedError

    def pop_records(self) -> list[dict[str, Any]]:
        """ds_gravac's per-step records since the last call (empty for the other systems)."""
        return []

    def pop_events(self) -> list[dict[str, Any]]:
        return []

    def dense_bytes(self) -> Optional[float]:
        """Bytes per step per rank for systems that all-reduce everything dense (None if not dense)."""
        return None

    def logical_bytes(self) -> Optional[tuple[float, float]]:
        """(bytes sent, dense-equivalent bytes) per rank for the last step, for systems whose library does not
        report them itself (ds_gravac does, through its telemetry); None when unknown."""
        dense = self.dense_bytes()
        return None if dense is None else (dense, dense)

    def save(self, save_dir: str, tag: str, client_state: dict[str, Any]) -> None:
        raise NotImplementedError

    def load(self, load_dir: str) -> tuple[Optional[str], dict[str, Any]]:
        raise NotImplementedError

    def local_state(self) -> dict[str, Any]:
        """Per-rank state outside the system's own checkpoint (DDP PowerSGD error memory)."""
        return {}

    def before_resume(self, dry_run: Callable[[], None]) -> None:
        """Called before any state is restored; ``dry_run`` does one forward+backward without a step."""

    def load_local_state(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        """Release what the system holds (ds_gravac's hooks and pending exchanges, DDP's reducer) at the end of a
        run, before ``shutdown`` destroys the process group."""

    def set_train(self, mode: bool) -> None:
        self.module.train(mode)


class EngineSystem(System):
    """A DeepSpeed engine, with or without ds_gravac attached."""

    def __init__(self, name: str, engine: Any, handle: Any, world_size: int, grad_jitter: float = 0.0,
                 seed: int = 0) -> None:
        self.name, self.engine, self.handle = name, engine, handle
        self.module, self.device = engine.module, engine.device
        self._dense = None if handle is not None else dense_ring_bytes(engine.module, world_size)
        self.grad_jitter, self.seed = grad_jitter, seed
        # DeepSpeed all-reduces at "communication_data_type" (fp32 unless the config says fp16/bf16)
        self._wire_fraction = _itemsize(getattr(engine, "communication_data_type", torch.float32)) / 4.0

    def forward(self, *inputs: Any) -> Any:
        return self.engine(*inputs)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        if self.grad_jitter and self.engine.is_gradient_accumulation_boundary():
            jitter_gradients_(self.module.parameters(), self.grad_jitter, self.seed, self.global_steps)
        self.engine.step()

    @property
    def global_steps(self) -> int:
        return int(self.engine.global_steps)

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def gradient_clipping(self) -> float:
        """The threshold in effect: the engine's, or DGC's, which takes the clipping over at attach (the engine then
        reports 0)."""
        if self.handle is not None:
            return self.handle.gradient_clipping()
        return float(self.engine.gradient_clipping() or 0.0)

    def pop_records(self) -> list[dict[str, Any]]:
        return self.handle.pop_stats() if self.handle is not None else []

    def pop_events(self) -> list[dict[str, Any]]:
        return self.handle.pop_events() if self.handle is not None else []

    def dense_bytes(self) -> Optional[float]:
        return self._dense if self._wire_fraction == 1.0 else None

    def logical_bytes(self) -> Optional[tuple[float, float]]:
        """DeepSpeed's own path: the fp32 ring scaled to the width it communicates at (ds_gravac reports its own)."""
        return None if self._dense is None else (self._dense * self._wire_fraction, self._dense)

    def save(self, save_dir: str, tag: str, client_state: dict[str, Any]) -> None:
        # an attached engine's save_checkpoint is the handle's: per-rank residuals and controller state included
        self.engine.save_checkpoint(save_dir, tag=tag, client_state=client_state)

    def load(self, load_dir: str) -> tuple[Optional[str], dict[str, Any]]:
        load_path, client_state = self.engine.load_checkpoint(load_dir)
        return load_path, dict(client_state or {})

    def set_train(self, mode: bool) -> None:
        self.engine.train(mode)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.drain()      # the last step's pipelined statistics exchange (as the HF callback does)


class DDPSystem(System):
    """torch DDP with DeepSpeed's semantics for what the config controls: loss divided by the accumulation
    steps, clipping at ``gradient_clipping`` (default 1.0 as in DeepSpeed), scheduler stepped per optimizer step.
    ``scheme`` is torch's communication scheme on top (:mod:`runners.ddp_comm`: PowerSGD, bf16 hook, post-local
    SGD). ``wrap=False`` (system ``local``) runs the same loop on the bare module: nothing is communicated."""

    def __init__(self, name: str, model: nn.Module, cfg: dict[str, Any], dist: DistInfo,
                 scheme: Optional[CommScheme] = None, wrap: bool = True,
                 schedule: Optional[Callable[[Any], Any]] = None) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from .common import device

        self.name, self.device = name, device()
        self.module = model.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DDP(self.module, device_ids=ids, bucket_cap_mb=DDP_BUCKET_CAP_MB) if wrap else None
        self.net: nn.Module = self.ddp if self.ddp is not None else self.module     # what forward runs
        self.scheme = scheme or CommScheme()
        if self.ddp is not None:
            self.scheme.register(self.ddp)
        inner = build_optimizer(cfg, self.module.parameters())
        self.optimizer = self.scheme.wrap_optimizer(inner)
        # the schedule drives the inner optimizer's param groups, which a wrapping optimizer shares
        self.scheduler = schedule(inner) if schedule is not None else build_scheduler(cfg, inner)
        self.gas = int(cfg.get("gradient_accumulation_steps", 1))
        self.clip = float(cfg.get("gradient_clipping", DEEPSPEED_CLIP_DEFAULT))
        self._global_steps, self.micro_steps = 0, 0
        self._ring = dense_ring_bytes(self.module, dist.world_size)
        self._ring_per_value = 2.0 * (dist.world_size - 1) / dist.world_size * 4   # fp32 ring all-reduce
        self._wrap = wrap

    def close(self) -> None:
        """Let go of DDP's reducer, which holds the process group and the last step's works, so that ``shutdown``
        destroys the group while the interpreter is whole. Held until exit, gloo's worker threads may release those
        works during finalization and abort a run that trained ("terminate called without an active exception",
        once in a clean-clone check on ``ddp_dense``)."""
        self.ddp, self.net = None, self.module
        gc.collect()

    def _boundary(self) -> bool:
        return (self.micro_steps + 1) % self.gas == 0

    def forward(self, *inputs: Any) -> Any:
        return self.net(*inputs)

    def sync_context(self) -> ContextManager[Any]:
        return contextlib.nullcontext() if self.ddp is None or self._boundary() else self.ddp.no_sync()

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.gas if self.gas > 1 else loss).backward()

    def step(self) -> None:
        if self._boundary():
            if self.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.scheduler is not None:
                self.scheduler.step()
            self._global_steps += 1
        self.micro_steps += 1

    @property
    def global_steps(self) -> int:
        return self._global_steps

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def gradient_clipping(self) -> float:
        return self.clip

    def dense_bytes(self) -> Optional[float]:
        """The fp32 ring of every gradient when each step sends it all (plain DDP); 0 for ``local``."""
        if not self._wrap:
            return 0.0
        return self._ring if type(self.scheme) is CommScheme else None

    def logical_bytes(self) -> Optional[tuple[float, float]]:
        """What the scheme sent in the last step (:meth:`runners.ddp_comm.CommScheme.sent_bytes`) against the fp32
        ring; ``local`` sends nothing."""
        if not self._wrap:
            return (0.0, 0.0)
        return (self.scheme.sent_bytes(self._ring, self._ring_per_value), self._ring)

    def save(self, save_dir: str, tag: str, client_state: dict[str, Any]) -> None:
        """Replicated state only (rank 0 writes, as DeepSpeed does with ZeRO-0); per-rank state goes through
        :meth:`local_state` into the runner's per-rank file."""
        import torch.distributed as tdist

        if tdist.get_rank() == 0:
            os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
            state = {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "lr_scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                     "global_steps": self._global_steps, "micro_steps": self.micro_steps,
                     "client_state": client_state}
            path = os.path.join(save_dir, tag, "ddp_checkpoint.pt")
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)
            with open(os.path.join(save_dir, "latest"), "w", encoding="utf-8") as f:
                f.write(tag)
        tdist.barrier()

    def load(self, load_dir: str) -> tuple[Optional[str], dict[str, Any]]:
        tag = read_latest_tag(load_dir)
        path = os.path.join(load_dir, tag, "ddp_checkpoint.pt")
        if not os.path.isfile(path):
            raise RunnerError(f"--resume {load_dir}: {path} not found (was it written by --system ddp?)")
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("lr_scheduler") is not None:
            self.scheduler.load_state_dict(state["lr_scheduler"])
        self._global_steps, self.micro_steps = int(state["global_steps"]), int(state["micro_steps"])
        return path, dict(state.get("client_state") or {})

    def local_state(self) -> dict[str, Any]:
        return self.scheme.local_state()

    def before_resume(self, dry_run: Callable[[], None]) -> None:
        """PowerSGD's error and P/Q memories are laid out like DDP's buckets, which DDP rebuilds in gradient-ready
        order after its first backward. A fresh DDP still has the initial layout, so the saved memories would
        land on the wrong tensors; one throw-away backward (fresh hook state, plain all-reduce; everything it
        touches is restored afterwards) makes the next forward rebuild the buckets exactly as in the saved run."""
        if isinstance(self.scheme, PowerSGD):
            dry_run()
            self.optimizer.zero_grad(set_to_none=True)

    def load_local_state(self, state: dict[str, Any]) -> None:
        self.scheme.load_local_state(state)


def _itemsize(dtype: Any) -> int:
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4


def read_latest_tag(save_dir: str) -> str:
    path = os.path.join(save_dir, "latest")
    if not os.path.isfile(path):
        raise RunnerError(f"--resume {save_dir}: no 'latest' file there (not a checkpoint directory?)")
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


# ---- construction ---------------------------------------------------------------------------------------


def _engine_args(args: argparse.Namespace) -> argparse.Namespace:
    """DeepSpeed refuses a config both in args and in ``config=``; runners pass the (overridden) dict."""
    ns = argparse.Namespace(**vars(args))
    ns.deepspeed_config = None
    if hasattr(ns, "deepscale_config"):
        ns.deepscale_config = None
    return ns


def _plain_engine(args: argparse.Namespace, cfg: dict[str, Any], model: nn.Module) -> Any:
    """A DeepSpeed engine on the config without its "gravac" section (no ds_gravac attached)."""
    import deepspeed

    engine, *_ = deepspeed.initialize(args=_engine_args(args), model=model, model_parameters=model.parameters(),
                                      config=without_gravac(cfg), lr_scheduler=scheduler_factory(args))
    return engine


def _with_schedule(args: argparse.Namespace, cfg: dict[str, Any]) -> dict[str, Any]:
    """The runner's ``--lr-warmup``/``--lr-decay-at`` schedule replaces the config's ``scheduler`` section (one
    schedule per run, the same for every system)."""
    if scheduler_factory(args) is None:
        return cfg
    return {k: v for k, v in cfg.items() if k != "scheduler"}


def build_system(args: argparse.Namespace, cfg: dict[str, Any], model: nn.Module, dist: DistInfo) -> System:
    """One of the four systems around ``model`` (already initialised identically on every rank)."""
    cfg = _with_schedule(args, cfg)
    if args.system in ("local", "local_engine"):
        if dist.world_size != 1:
            raise RunnerError(f"--system {args.system} measures the compute-only step on one rank; this launch has "
                              f"{dist.world_size} ranks (start it without a launcher or with --nproc_per_node 1)")
        if args.system == "local":
            return DDPSystem("local", model, cfg, dist, wrap=False, schedule=scheduler_factory(args))
        engine = _plain_engine(args, cfg, model)
        engine.enable_backward_allreduce = False       # nothing crosses the wire, not even a 1-rank all-reduce
        return EngineSystem("local_engine", engine, None, 1)
    if args.system.startswith("ddp"):
        return DDPSystem(args.system, model, cfg, dist, scheme_for(args.system, args), schedule=scheduler_factory(args))
    stage = int((cfg.get("zero_optimization") or {}).get("stage", 0))
    if getattr(args, "grad_jitter", 0.0) and stage > 0:         # ZeRO keeps its gradients out of p.grad
        raise RunnerError(f"--grad-jitter needs ZeRO stage 0; this config has stage {stage}")
    if args.system == "deepspeed":
        return EngineSystem("deepspeed", _plain_engine(args, cfg, model), None, dist.world_size,
                            args.grad_jitter, args.seed)
    import ds_gravac

    engine, *_ = ds_gravac.initialize(args=_engine_args(args), model=model, model_parameters=model.parameters(),
                                      config=cfg, lr_scheduler=scheduler_factory(args))
    return EngineSystem("gravac", engine, ds_gravac.get_handle(engine), dist.world_size, args.grad_jitter, args.seed)
