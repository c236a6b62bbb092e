"""Which levels a controller may use with a compressor: GraVAC's θ range and Accordion's two levels.

Sparsifiers realize any CF ≥ 1 and low-rank compressors any integer rank, but a quantizer realizes a fixed grid
of CFs (``cf_grid``: terngrad 4/8/16/32, qsgd 4/8/16, the others a single value). GraVAC's range therefore snaps
to the grid — and without ``theta_min``/``theta_max`` in the config it spans the whole grid, since the general
defaults (10 and 1000) would leave at most one quantizer level — while Accordion's two levels must be grid
values. A compressor with a single level gives neither controller anything to choose.

The same pure functions run twice: at attach, on the compressor, before anything is agreed or changed (so a bad
combination fails on every rank with the key, the value and what to use), and in the controllers' ``bind``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from ..compress.base import Compressor
from ..compress.kinds import GainKind, LevelKind
from ..config import AccordionConfig, GravacConfig
from ..compress.lowrank import uniform_levels
from ..errors import GravacConfigError

# (low, high) compression of Accordion when the config leaves them unset; a quantizer uses its grid's ends.
DEFAULT_LEVELS = {LevelKind.CF: (1.01, 10.0), LevelKind.RANK: (4.0, 1.0)}
AUTO_COMPRESSORS = ("powersgd", "qsgd", "topk")   # mode "auto": per-group ranks, bits or CFs (docs/algorithms.md §8)
GRAVAC_NEEDS = "ds_gravac: mode 'gravac' needs a compressor with gain_kind 'projection' and >= 2 realizable CFs"

Realize = Callable[[float], float]


def grid_levels(grid: Optional[Sequence[float]]) -> Optional[list[float]]:
    """The distinct realizable CFs, sorted; None for a continuous CF."""
    return None if grid is None else sorted({float(g) for g in grid})


def _cfs(levels: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in levels)


def gravac_range(config: GravacConfig, name: str, level_kind: LevelKind, gain_kind: GainKind,
                 grid: Optional[Sequence[float]],
                 realize: Realize, static_only: bool = False) -> tuple[float, float]:
    """``(θ_min0, θ_max)`` GraVAC searches with this compressor; a :class:`GravacConfigError` when it cannot
    drive it (levels are ranks, no meaningful gain, a single CF, or a level that does not steer the payload)."""
    levels = grid_levels(grid)
    single = levels is not None and len(levels) < 2
    if level_kind != LevelKind.CF or gain_kind == GainKind.NONE or static_only or single:
        if level_kind != LevelKind.CF:
            why = f"it is levelled by {str(level_kind)!r}"
        elif static_only:
            why = "its level only bounds the payload, it does not steer what is sent"
        else:
            reasons = [f"it realizes only the CF {_cfs(levels or [])}"] if single else []
            if gain_kind == GainKind.NONE:
                reasons.append(f"its compression gain is meaningless (gain_kind {str(gain_kind)!r})")
            why = " and ".join(reasons)
        accordion_ok = level_kind == LevelKind.RANK or levels is None or len(levels) >= 2
        use = "'static' or 'accordion'" if accordion_ok and not static_only else "'static'"
        raise GravacConfigError(f"{GRAVAC_NEEDS}; {name!r} is static-only ({why}; use mode {use}) "
                                f"(keys \"mode\": \"gravac\", \"compressor\": \"{name}\")")
    lo, hi = float(config.gravac.theta_min), float(config.gravac.theta_max)
    if levels is None:
        return lo, hi
    chosen = config.gravac.model_fields_set
    lo = lo if "theta_min" in chosen else levels[0]
    hi = hi if "theta_max" in chosen else levels[-1]
    reach = [g for g in levels if realize(lo) <= g <= realize(hi)]
    if len(reach) < 2:
        shown = [f"{v:g}" if key in chosen else f"unset: {v:g}" for key, v in (("theta_min", lo), ("theta_max", hi))]
        raise GravacConfigError(
            f"ds_gravac: theta_min ({shown[0]}) and theta_max ({shown[1]}) snap to the single CF "
            f"{_cfs(reach)} of compressor {name!r}, whose CFs are {_cfs(levels)}; GraVAC needs at least two of them between "
            f"theta_min (snapped up to the next CF) and theta_max, or leave both keys unset to search the whole "
            f"grid (keys \"theta_min\", \"theta_max\" of the \"gravac\" object)")
    return lo, hi


def accordion_levels(acc: AccordionConfig, name: str, level_kind: LevelKind, grid: Optional[Sequence[float]],
                     realize: Realize) -> tuple[float, float]:
    """Accordion's ``(low, high)`` compression levels (CFs or ranks) for this compressor, validated."""
    kind = LevelKind.RANK if level_kind == LevelKind.RANK else LevelKind.CF
    levels = grid_levels(grid) if kind == LevelKind.CF else None
    if levels == [1.0]:     # compresses nothing (``none``): attach's compressibility check names that problem
        levels = None
    low_d, high_d = DEFAULT_LEVELS[kind]
    if levels is not None:
        if len(levels) < 2:
            raise GravacConfigError(f"ds_gravac: mode 'accordion' switches between two compression levels, but "
                                    f"compressor {name!r} realizes only the CF {_cfs(levels)}; use mode 'static' "
                                    f"(keys \"mode\": \"accordion\", \"compressor\": \"{name}\")")
        low_d, high_d = levels[0], levels[-1]
    low = float(acc.low_compression) if acc.low_compression is not None else low_d
    high = float(acc.high_compression) if acc.high_compression is not None else high_d
    if kind == LevelKind.RANK:
        if low != int(low) or high != int(high) or high > low:
            raise GravacConfigError(f"ds_gravac: accordion levels for a low-rank compressor must be integer "
                                    f"ranks with high_compression <= low_compression (got {low:g}/{high:g})")
        return low, high
    if levels is not None:
        for key, value in (("accordion.low_compression", low), ("accordion.high_compression", high)):
            if value not in levels:
                raise GravacConfigError(f"ds_gravac: {key} ({value:g}) is not a CF of compressor {name!r}; "
                                        f"allowed: {_cfs(levels)} (key \"{key}\")")
    if high < low:
        raise GravacConfigError(f"ds_gravac: accordion.high_compression ({high:g}) must compress at least "
                                f"as much as accordion.low_compression ({low:g})")
    return float(realize(low)), float(realize(high))


def uniform_bound(config: GravacConfig) -> float:
    """θ_min of GraVAC over the uniform rank ladder: the configured one snapped up to a rung, else the first rung
    (rank 64). It fixes the widest factors (the largest rank the run can ask for)."""
    levels = uniform_levels()
    if "theta_min" not in config.gravac.model_fields_set:
        return levels[0]
    return next((g for g in levels if g >= float(config.gravac.theta_min)), levels[-1])


def classifier_shapes(named_params: Sequence[tuple[str, Any]], accepts: Callable[[tuple[int, ...]], bool],
                      min_compress_numel: int) -> list[tuple[int, ...]]:
    """The shape of the classifier the uniform ladder pins: the last matrix, in registration order, that would be
    compressed (torchvision's ``fc``/``classifier``, a language model's decoder). Empty when nothing is."""
    shapes = [tuple(int(s) for s in p.shape) for _, p in named_params
              if p.numel() >= max(1, min_compress_numel) and accepts(tuple(p.shape))]
    return shapes[-1:]


def check_rank_ladder(config: GravacConfig, compressor: Compressor) -> None:
    """``rank_ladder: "uniform"`` only means something for GraVAC over a low-rank compressor."""
    if config.gravac.rank_ladder == "cf" or compressor.ladder == "uniform":
        return
    what = (f"mode is {config.mode!r}" if config.mode != "gravac"
            else f"compressor {config.compressor.type!r} is not low-rank")
    raise GravacConfigError(f"ds_gravac: key \"gravac.rank_ladder\" ({config.gravac.rank_ladder!r}) needs mode "
                            f"'gravac' with a low-rank compressor (powersgd, acpsgd), but {what}; allowed values: 'cf' (default), "
                            f"'uniform'")


def check_auto(config: GravacConfig, name: str) -> None:
    """``mode: "auto"`` drives PowerSGD's rank, QSGD's bits or Top-k's CF per layer group: other compressors, a
    fixed level it would ignore, and QSGD with error feedback (whose error is not the variance auto budgets) are
    refused."""
    hint = ("" if "mode" in config.model_fields_set else
            "; \"mode\" is not set and defaults to 'auto' since 0.5: set \"mode\": \"static\" for one fixed level")
    if name not in AUTO_COMPRESSORS:
        raise GravacConfigError(f"ds_gravac: mode 'auto' drives a compressor's level per layer group and "
                                f"supports {', '.join(AUTO_COMPRESSORS)} in this version, not {name!r} (keys "
                                f"\"mode\": \"auto\", \"compressor\": \"{name}\"){hint}")
    for key in ("cf", "warmup_steps"):
        if key in config.model_fields_set:
            instead = "auto.warmup_steps" if key == "warmup_steps" else "no level key: auto picks one per group"
            raise GravacConfigError(f"ds_gravac: key \"{key}\" ({getattr(config, key)!r}) is static mode's and is not "
                                    f"read by mode 'auto' ({instead}); remove it{hint}")
    params = config.compressor.params
    fixed = {"powersgd": ("rank", "the ranks 64, 32, 16, 8, 4, 2"), "qsgd": ("levels", "8, 4 and 2 bits")}.get(name)
    if fixed is not None and fixed[0] in params:
        raise GravacConfigError(f"ds_gravac: key \"compressor.params.{fixed[0]}\" ({params[fixed[0]]!r}) is not "
                                f"read by mode 'auto', whose levels are {fixed[1]} per layer group; remove the key")
    if name == "qsgd" and params.get("error_feedback"):
        raise GravacConfigError("ds_gravac: key \"compressor.params.error_feedback\" (true) is refused in mode "
                                "'auto': auto budgets QSGD's variance, which error feedback turns into delayed "
                                "energy; remove the key (QSGD is unbiased without it)")


def check_classifier_rank(config: GravacConfig) -> None:
    """``compressor.params.classifier_rank`` fixes the classifier's rank beside a static (or Accordion's) rank;
    GraVAC's CF levels and auto's per-group ranks would ignore it, so it is refused there."""
    value = config.compressor.params.get("classifier_rank")
    if value is None or config.mode in ("static", "accordion", "dense"):
        return
    raise GravacConfigError(f"ds_gravac: key \"compressor.params.classifier_rank\" ({value!r}) is read in modes "
                            f"'static' and 'accordion', not {config.mode!r}; remove the key or use mode 'static'")


def check_mode(config: GravacConfig, compressor: Compressor) -> None:
    """Attach-time check that ``config.mode`` can drive ``compressor`` with the configured levels."""
    check_rank_ladder(config, compressor)
    check_classifier_rank(config)
    name = config.compressor.type
    grid = compressor.cf_grid()
    if config.mode == "gravac":
        gravac_range(config, name, compressor.level_kind, compressor.gain_kind, grid, compressor.realize_cf,
                     static_only=compressor.static_only)
    elif config.mode == "accordion":
        accordion_levels(config.accordion, name, compressor.level_kind, grid, compressor.realize_cf)
    elif config.mode == "auto":
        check_auto(config, name)


__all__ = ["AUTO_COMPRESSORS", "DEFAULT_LEVELS", "accordion_levels", "check_auto", "check_classifier_rank",
           "check_mode", "check_rank_ladder", "classifier_shapes", "grid_levels", "gravac_range", "uniform_bound"]
