"""``attach``/``detach`` and the :class:`GravacHandle`: everything is validated and agreed across ranks before
the engine is changed."""
from __future__ import annotations

import contextlib
import difflib
import logging
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import torch

from ..adapt import Controller, build_controller
from ..adapt.auto.timing import measure_link
from ..adapt.levels import classifier_shapes
from ..compress.base import Compressor
from ..compress.kinds import LevelKind, describe_level
from ..config import GravacConfig, parse_config
from ..errors import GravacConfigError
from ..sync.buckets import Member, classify, sync_members
from ..sync.collectives import Channels
from ..sync.synchronizer import Synchronizer
from ..telemetry.sinks import JsonlSink
from .. import version
from .agreement import agree_config, agree_ok, agree_parameters
from .engine_settings import MovedSettings
from .checkpoint import load_checkpoint, route_engine_checkpoints, save_checkpoint, unroute_engine_checkpoints
from . import teardown
from .build import build_compressor, check_optimizer_takeover, controller_context, exchange_rule, reject_unimplemented
from .shm_buffer import release_shm_buffer
from .validation import validate_engine
from .zero import ZeroBridge, zero_stage

logger = logging.getLogger("ds_gravac")
HANDLE_ATTR = "_ds_gravac_handle"
NO_SECTION = ('ds_gravac.initialize: the DeepSpeed config has no "gravac" section; add one (an empty object '
              'selects the defaults) or call deepspeed.initialize')


def attached_line(cfg: GravacConfig, comp: Compressor, members: Sequence[Member]) -> str:
    """The one line rank 0 prints when ds_gravac takes an engine over: what it compresses, and where to see the
    bytes (a user cannot otherwise tell a compressed run from a plain one)."""
    compressed = [m for m in members if m.compressible]
    share = sum(m.numel for m in compressed) / max(1, sum(m.numel for m in members))
    what = comp.name
    if cfg.mode == "static":
        level = comp.default_level() if comp.level_kind == LevelKind.RANK or cfg.cf is None else cfg.cf
        if level is not None:
            what += f" at {describe_level(comp.kind, comp.level_kind, level)}"
    return (f"ds_gravac: attached, mode {cfg.mode}, {what}: {len(compressed)} of {len(members)} gradient tensors "
            f"({share:.1%} of the values) compressed; bytes per step: handle.last_stats() or the "
            f"\"telemetry.jsonl\" key; per bucket: python -m ds_gravac.plan")


def _version() -> str:
    """Read when called, not at import (a test stands in an older writer by setting ``ds_gravac.version``)."""
    return version.__version__


class GravacHandle:
    """One per engine: owns the synchronizer, compressor, controller and telemetry.

    ``attach`` runs three stages: :meth:`_validate` (every check and every cross-rank agreement; nothing of the
    engine changes, so a refusal leaves it as it was), :meth:`_build` (ds_gravac's own objects: groups, controller,
    synchronizer), and :meth:`_install`, the one place the engine is changed; :meth:`detach` undoes exactly what
    :meth:`_install` did, in reverse order."""

    def __init__(self, engine: Any, config: GravacConfig, section: Mapping[str, Any]) -> None:
        self.engine = engine
        self.config = config
        self.section = dict(section)
        self.active = False
        self.compressor: Optional[Compressor] = None
        self.controller: Optional[Controller] = None
        self.sync: Optional[Synchronizer] = None
        self.channels: Optional[Channels] = None
        self.settings: Optional[MovedSettings] = None
        self._sink: Optional[JsonlSink] = None
        self.zero: Optional[ZeroBridge] = None
        self.routed_checkpoint_attributes: dict[str, Any] = {}     # while routed here: what detach puts back

    # ---- lifecycle: validate -> build -> install; detach ----------------------------------------------
    def _activate(self, bucket_order: Optional[list[int]] = None) -> None:
        import deepspeed.comm as dist
        world, rank = dist.get_world_size(), dist.get_rank()
        comp = self._validate(world, rank)
        self._build(comp, world, rank, bucket_order)
        self._install()
        if rank == 0:               # printed: DeepSpeed's logger shows only warnings by default
            print(attached_line(self.config, comp, self.sync.members), flush=True)

    def _validate(self, world: int, rank: int) -> Compressor:
        """Every check and agreement attach makes, before anything of the engine changes; returns the compressor
        (bound to the model: the uniform rank ladder pins the classifier's factor width here)."""
        eng, cfg = self.engine, self.config
        comp = build_compressor(cfg)
        comp.check_engine(eng)
        agree_config(cfg.normalized(), {"compressor class": f"{type(comp).__module__}.{type(comp).__qualname__}",
                                        "ds_gravac version": _version(), "world size": world}, None)
        agree_parameters(eng.module.named_parameters())
        release_shm_buffer(rank)    # every rank has mapped the peers' buffers by now (shm_buffer.py)
        named = _trainable(eng)
        ready_compressor(cfg, comp, named)
        check_optimizer_takeover(cfg, comp, [m.name for m in sync_members(named, cfg, comp) if not m.compressible],
                                 float(eng.gradient_clipping() or 0.0))
        agree_ok(self._open_sink(rank), None)
        return comp

    def _build(self, comp: Compressor, world: int, rank: int, bucket_order: Optional[list[int]]) -> None:
        """ds_gravac's own objects; collectives among the ranks (groups, calibration), no change to the engine."""
        eng, cfg = self.engine, self.config
        self.compressor = comp
        self.channels = Channels.create(cfg.timeout_s)
        teardown.track(self)
        self.controller = build_controller(cfg)
        self.sync = Synchronizer(eng, cfg, comp, self.controller, self.channels, exchange_rule(cfg, eng, world),
                                 bucket_order, on_record=self._on_record)
        self.settings = MovedSettings(eng, cfg, comp, world)
        if zero_stage(eng) in (1, 2):
            self.zero = ZeroBridge(eng)
            self.sync.loss_scale, self.sync.after_write = self.zero.loss_scale, self.zero.fill_partitions
        compressible = tuple(m.name for m in self.sync.members if m.compressible)
        cm, link, remeasure = cfg.cost_model, None, None
        if cfg.mode == "auto" and cfg.auto.link == "measure":      # every rank, at attach: agreed fits of the link
            def remeasure() -> Any:
                return measure_link(cm.probe_bytes, cm.probe_repeats, self.channels, self.controller.link_ops,
                                    comp if self.controller.codec_levels else None, self.controller.codec_levels,
                                    cfg.seed)
            link = remeasure()
        self.controller.bind(controller_context(cfg, comp, eng, world, rank, compressible,
                                                lambda: _agreed_fits(self.sync, link), remeasure,
                                                rule=self.sync.rule))

    def _install(self) -> None:
        """The one place the engine changes: our gradient hooks in, ZeRO's out, the settings we apply ourselves
        taken over, DeepSpeed's all-reduce off, checkpoints routed through the handle."""
        self.sync.install()
        if self.zero is not None:
            self.zero.install()
        self.settings.take()
        self.sync.local_clip = self.settings.local_clip
        self.engine.enable_backward_allreduce = False
        route_engine_checkpoints(self)
        self.active = True

    def detach(self) -> None:
        """Wait for in-flight work, then undo :meth:`_install` in reverse order: gradient averaging goes back
        to DeepSpeed."""
        if self.active and self.sync is not None:
            self.sync.drain()
            nonzero = self.sync.memory.nonzero() or self.sync.server.nonzero()
            unroute_engine_checkpoints(self)
            self.engine.enable_backward_allreduce = True
            self.settings.give_back()
            if self.zero is not None:
                self.zero.close()
                self.zero = None
            self.sync.close()
            if nonzero:
                logger.warning("ds_gravac: detach drops non-zero error-feedback residuals")
        if self._sink is not None:
            self._sink.close()
        self.active = False
        if getattr(self.engine, HANDLE_ATTR, None) is self:
            delattr(self.engine, HANDLE_ATTR)

    def _open_sink(self, rank: int) -> Optional[str]:
        """Open the JSON-lines file on the ranks that write one; a failure is reported, not raised, so that
        every rank raises it together (a rank that failed alone would leave the others waiting)."""
        path = self.config.telemetry.jsonl
        if not path or ("{rank}" not in path and rank != 0):
            return None
        target = path.replace("{rank}", str(rank))
        try:
            self._sink = JsonlSink(target)
        except OSError as exc:
            return f"ds_gravac: telemetry.jsonl: cannot create '{target}': {exc.strerror or exc}"
        return None

    @contextlib.contextmanager
    def engine_settings(self) -> Iterator[None]:
        """The engine's own momentum, weight decay and clipping during a checkpoint save or load
        (:meth:`MovedSettings.given_back`)."""
        if not self.active or self.settings is None:
            yield
            return
        with self.settings.given_back():
            yield

    def _on_record(self, rec: dict[str, Any]) -> None:
        if self._sink is not None and self.config.log_interval and rec["step"] % self.config.log_interval == 0:
            self._sink.write(rec)

    def release(self) -> None:
        """At interpreter exit (``teardown``): wait for the last step's exchange, stop hooking the engine and
        destroy our process groups."""
        if self.sync is not None:
            self.sync.drain()
            self.sync.close()
        if self.channels is not None:
            self.channels.release()

    @property
    def rank(self) -> int:
        """This process's rank (0 when ds_gravac is passive)."""
        return self.sync.rank if self.sync is not None else 0

    def gradient_clipping(self) -> float:
        """The clipping threshold in effect: the compressor's when it took the engine's clipping over at attach
        (the engine then reports 0), else the engine's."""
        if self.settings is not None:
            return self.settings.clipping_in_effect()
        return float(self.engine.gradient_clipping() or 0.0)

    def drain(self) -> None:
        """Wait for the last step's pending statistics exchange (before exit, checkpoints, or reading stats)."""
        if self.sync is not None:
            self.sync.drain()

    # ---- metrics ----------------------------------------------------------------------------------------
    def last_stats(self) -> dict[str, Any]:
        return dict(self.sync.last_record) if self.sync is not None else {}

    def pop_stats(self) -> list[dict[str, Any]]:
        return self.sync.pop_records() if self.sync is not None else []

    def pop_events(self) -> list[dict[str, Any]]:
        return self.controller.pop_events() if self.controller is not None else []

    # ---- state ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        from .checkpoint import handle_state
        return handle_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        from .checkpoint import load_handle_state
        load_handle_state(self, state)

    def save_checkpoint(self, save_dir: str, tag: Optional[str] = None, client_state: Optional[dict] = None,
                        *ds_args: Any, **ds_kwargs: Any) -> Any:
        """What ``engine.save_checkpoint`` does while attached (it is routed here)."""
        return save_checkpoint(self, save_dir, tag, client_state, *ds_args, **ds_kwargs)

    def load_checkpoint(self, load_dir: str, tag: Optional[str] = None, *ds_args: Any, **ds_kwargs: Any) -> Any:
        """What ``engine.load_checkpoint`` does while attached (it is routed here)."""
        return load_checkpoint(self, load_dir, tag, *ds_args, **ds_kwargs)


def _trainable(engine: Any) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad and p.numel() > 0]


def _agreed_fits(sync: Synchronizer, link: Any) -> Any:
    """The cost model's agreed fits when it has them, else the link measured at attach (mode auto), else None."""
    fits = getattr(sync.planner.selector, "fits", None)
    return fits if fits is not None else link


def check_compressible(cfg: GravacConfig, comp: Compressor, named: list[tuple[str, torch.Tensor]]) -> None:
    """Accordion and auto switch levels per compressed tensor: with nothing compressible they have nothing to
    decide (``named``: the engine's trainable parameters)."""
    if cfg.mode not in ("accordion", "auto"):
        return
    if not any(m.compressible for m in classify(named, comp.accepts, cfg.min_compress_numel,
                                                comp.name != "none")):
        largest = max((p.numel() for _, p in named), default=0)
        raise GravacConfigError(f"ds_gravac: mode '{cfg.mode}' needs at least one compressed tensor, but with "
                                f"compressor '{cfg.compressor.type}' and min_compress_numel "
                                f"{cfg.min_compress_numel} (largest tensor: {largest} elements) none is "
                                f"compressed; lower min_compress_numel or use mode 'dense'")


def ready_compressor(cfg: GravacConfig, comp: Compressor, named: list[tuple[str, torch.Tensor]]) -> None:
    """Before any plan: refuse a mode with nothing to decide, and tell the compressor its classifier (the
    uniform rank ladder's floor, low rank's ``classifier_rank``; attach, and ``python -m ds_gravac.plan``)."""
    check_compressible(cfg, comp, named)
    comp.pin(classifier_shapes(named, comp.accepts, cfg.min_compress_numel))


def no_section_warning(engine: Any) -> str:
    """``ds_gravac.launch`` leaves an engine without a ``"gravac"`` section alone; it says so, and names a key of
    the config that looks like a misspelling of it."""
    ds_cfg = getattr(engine, "config", None)
    keys = [str(k) for k in ds_cfg] if isinstance(ds_cfg, Mapping) else []
    near = difflib.get_close_matches("gravac", keys, n=1, cutoff=0.6)
    hint = f' (the config has "{near[0]}": did you mean "gravac"?)' if near else ""
    return (f'ds_gravac.launch: the DeepSpeed config has no "gravac" section{hint}, so this engine runs plain '
            f'DeepSpeed, uncompressed; add "gravac": {{}} to compress its gradients')


def _resolve_section(engine: Any, config: Union[Mapping[str, Any], GravacConfig, None]) -> Mapping[str, Any]:
    if config is not None:
        return config.normalized() if isinstance(config, GravacConfig) else config
    ds_cfg = getattr(engine, "config", None)
    section = ds_cfg.get("gravac") if isinstance(ds_cfg, Mapping) else None
    if section is None:
        raise GravacConfigError(NO_SECTION)
    return section


def attach(engine: Any, config: Union[Mapping[str, Any], GravacConfig, None] = None) -> GravacHandle:
    """Take over the engine's gradient averaging. Collective: every rank calls it between optimizer steps."""
    existing = getattr(engine, HANDLE_ATTR, None)
    if existing is not None:
        if (config is not None and parse_config(_resolve_section(engine, config)).config_hash()
                != existing.config.config_hash()):
            raise GravacConfigError("ds_gravac: engine already attached with a different 'gravac' config; "
                                    "call handle.detach() first")
        return existing
    section = _resolve_section(engine, config)
    cfg = parse_config(section)
    handle = GravacHandle(engine, cfg, section)
    if cfg.enabled:
        reject_unimplemented(cfg)
        validate_engine(engine)
        if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
            build_compressor(cfg)   # still report config errors
            release_shm_buffer(0)   # a single rank maps no peer's buffer
            logger.warning("ds_gravac: world size 1: nothing to communicate; ds_gravac stays passive")
        else:
            handle._activate()
    setattr(engine, HANDLE_ATTR, handle)
    return handle


def get_handle(engine: Any) -> Optional[GravacHandle]:
    return getattr(engine, HANDLE_ATTR, None)
