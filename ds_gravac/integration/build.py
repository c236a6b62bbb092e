"""Build the compressor a config names, before anything touches the engine: look it up, validate its parameters,
bind its levels to the mode (the "build" stage of attach; ``engine.attach`` installs it)."""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from pydantic import ValidationError

from ..adapt.auto.ladder import RANKS as AUTO_RANKS
from ..adapt.base import ControllerContext
from ..adapt.levels import DEFAULT_LEVELS, check_mode, uniform_bound
from ..compress.base import Compressor, Kind, LevelKind
from ..compress.registry import lookup
from ..config import GravacConfig, unavailable_settings
from ..errors import GravacConfigError, GravacUnsupportedError
from ..sync.reduce_rule import ReduceRule


def reject_unimplemented(config: GravacConfig) -> None:
    """Settings the schema accepts but this version cannot honour fail loudly instead of being ignored."""
    problems = unavailable_settings(config)
    if problems:
        raise GravacUnsupportedError("ds_gravac: " + "; ".join(problems))


def build_compressor(config: GravacConfig) -> Compressor:
    """Look up the compressor and validate its parameters (after plug-ins registered)."""
    try:
        cls = lookup(config.compressor.type)
    except GravacConfigError as exc:
        raise GravacConfigError(f'{exc} (key "compressor.type")') from None
    try:
        params = cls.Params.model_validate(config.compressor.params)
    except ValidationError as exc:
        # the default type changed in 0.4 (powersgd -> qsgd): name it when the section never chose one
        hint = ("" if "type" in config.compressor.model_fields_set else
                f' (key "compressor.type" is not set, so it is the default \'{config.compressor.type}\'; set '
                f'"type" to the compressor these parameters are for, e.g. "powersgd" for "rank")')
        raise GravacConfigError(f"ds_gravac: invalid parameters for compressor '{config.compressor.type}'{hint}: "
                                f"{exc}") from None
    comp = cls(params)
    if comp.level_kind == LevelKind.RANK:
        if config.mode == "static" and config.cf is not None:
            raise GravacConfigError(f"ds_gravac: key \"cf\" ({config.cf:g}) does not apply to the low-rank "
                                    f"compressor '{config.compressor.type}'; set its rank instead: "
                                    f"\"compressor\": {{\"type\": \"{config.compressor.type}\", "
                                    f"\"params\": {{\"rank\": 4}}}}")
        comp.bind_levels(*rank_level_bound(config, comp))
    check_mode(config, comp)      # the mode can drive this compressor's levels (e.g. a quantizer's grid)
    return comp


def static_default_level(config: GravacConfig, comp: Compressor) -> Optional[float]:
    """The level static mode uses when the config does not choose one: a low-rank compressor's rank, a
    quantizer's own CF (e.g. TernGrad's bit width) when no ``cf`` key is set (:meth:`Compressor.default_level`)."""
    if comp.level_kind == LevelKind.RANK or (comp.kind == Kind.QUANTIZED and config.cf is None):
        level = comp.default_level()
        return None if level is None else float(level)
    return None


def rank_level_bound(config: GravacConfig, comp: Compressor) -> tuple[str, float]:
    """How a rank-levelled (low-rank) compressor reads levels in this mode, and the largest rank it can be asked
    for: GraVAC works in CFs (bound: theta_min), static in the compressor's rank, Accordion in its two ranks."""
    if config.mode == "gravac":
        if config.gravac.rank_ladder == "uniform":
            return "uniform", uniform_bound(config)
        return LevelKind.CF, float(config.gravac.theta_min)
    own = comp.default_level()
    rank = float(own) if own is not None else 1.0
    if config.mode == "auto":
        return LevelKind.RANK, float(AUTO_RANKS[0])          # the largest rung of auto's ladders
    if config.mode == "accordion":
        low, high = DEFAULT_LEVELS[LevelKind.RANK]
        acc = config.accordion
        return LevelKind.RANK, max(float(acc.low_compression or low), float(acc.high_compression or high))
    return LevelKind.RANK, rank


AUTO_DENSE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def exchange_rule(config: GravacConfig, engine: Any, world_size: int) -> ReduceRule:
    """How this run averages dense buckets: DeepSpeed's rule, except that ``mode: "auto"`` sends its dense rung
    in ``auto.dense_dtype`` when the engine would send fp32 (a DeepSpeed ``communication_data_type`` the user set
    is kept). Dense 16-bit gradients are what a user would otherwise run (DDP's bf16 hook, DeepSpeed's
    ``communication_data_type``), so an fp32 dense rung would make ``auto`` slower than that on a fast link."""
    rule = ReduceRule.from_engine(engine, world_size)
    dtype = AUTO_DENSE_DTYPES.get(config.auto.dense_dtype) if config.mode == "auto" else None
    if dtype is not None and rule.comm_dtype == torch.float32:
        return rule.sending(dtype)
    return rule


def controller_context(config: GravacConfig, comp: Compressor, engine: Any, world_size: int, rank: int,
                       compressible: tuple[str, ...], cost_fits: Optional[Callable[[], Any]] = None,
                       measure_link: Optional[Callable[[], Any]] = None, *, rule: ReduceRule) -> ControllerContext:
    """The static facts a controller is bound with (attach, and ``python -m ds_gravac.plan`` for one rank);
    ``rule``: the run's averaging (``exchange_rule``), whose dense bytes per value the controller prices."""
    return ControllerContext(
        world_size=world_size, samples_per_step=int(engine.train_micro_batch_size_per_gpu()
                                                    * engine.gradient_accumulation_steps()),
        realize_cf=comp.realize_cf, cf_grid=comp.cf_grid(), multilevel=comp.multilevel,
        gain_kind=comp.gain_kind, level_kind=comp.level_kind, compressible=compressible, rank=rank,
        default_level=static_default_level(config, comp), cost_fits=cost_fits, measure_link=measure_link,
        dense_bytes_per_element=rule.comm_bytes_per_element)


def check_optimizer_takeover(config: GravacConfig, comp: Compressor, dense: Sequence[str], clip: float) -> None:
    """A compressor that applies momentum itself (DGC) takes the optimizer's momentum and the engine's clipping
    over: every tensor must then be compressed (``dense``: the names sent dense), and a clipping threshold needs
    a compressor that clips each rank's gradient itself (``clips_locally``: DGC's ``clip_norm``)."""
    if not comp.owns_optimizer:
        return
    if dense:
        raise GravacConfigError(f"ds_gravac: compressor '{config.compressor.type}' applies momentum "
                                f"itself, so every tensor must be compressed; set min_compress_numel to 0 "
                                f"(dense: {', '.join(dense[:5])}{'...' if len(dense) > 5 else ''})")
    if clip > 0.0 and not comp.clips_locally:
        raise GravacConfigError(f"ds_gravac: compressor '{config.compressor.type}' applies momentum "
                                f"itself and has no clip_norm to take over gradient_clipping ({clip:g}); "
                                f"set gradient_clipping to 0")


__all__ = ["AUTO_DENSE_DTYPES", "build_compressor", "check_optimizer_takeover", "controller_context",
           "exchange_rule", "rank_level_bound", "reject_unimplemented", "static_default_level"]
