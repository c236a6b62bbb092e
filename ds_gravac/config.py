"""Pydantic models of the top-level ``"gravac"`` section of the DeepSpeed config (every key: docs/configuration.md).

Strict like DeepSpeed's own sections: unknown keys are errors, defaults are validated, ``"auto"`` means "not set"
(Hugging Face configs use it). Types are strict as well: ``"cf": "10"``, ``"enabled": "false"`` or ``"cf": true``
are errors, not silently coerced (a JSON ``true`` would otherwise become CF 1.0, i.e. no compression). Every
validation problem surfaces as one :class:`GravacConfigError`.
"""
from __future__ import annotations

import difflib
import json
from typing import Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .compress.base import stable_hash
from .config_aliases import migrate, renamed_location
from .errors import GravacConfigError


AUTO_COMPRESSOR = "powersgd"     # mode "auto"'s compressor and smallest compressed tensor when the config sets none
AUTO_MIN_COMPRESS_NUMEL = 16384
SPARSIFIER_CF = 100.0     # static mode's CF without a "cf" key, for compressors without a grid of their own


class StrictModel(BaseModel):
    """Mirror of DeepSpeed's ``DeepSpeedConfigModel`` settings."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=True,
                              populate_by_name=True, use_enum_values=True, strict=True,
                              allow_inf_nan=False)   # "cf": Infinity or NaN would pass every bound check


class CompressorSpec(StrictModel):
    """``{"type": name, "params": {...}}``; parameters are validated by the compressor at attach."""

    type: str = "qsgd"
    params: dict[str, Any] = Field(default_factory=dict)


class AccordionConfig(StrictModel):
    interval_steps: Optional[int] = Field(None, ge=1)
    accum_steps: Optional[int] = Field(None, ge=1)
    eta: float = Field(0.5, gt=0)
    low_compression: Optional[float] = Field(None, ge=1)
    high_compression: Optional[float] = Field(None, ge=1)
    lr_decay_rule: bool = True
    reset_ef_on_switch: bool = False

    @model_validator(mode="after")
    def _accum_within_interval(self) -> "AccordionConfig":
        if (self.accum_steps is not None and self.interval_steps is not None
                and self.accum_steps > self.interval_steps):
            raise ValueError(f"accordion.accum_steps ({self.accum_steps}) must be <= "
                             f"accordion.interval_steps ({self.interval_steps})")
        return self   # level order depends on the compressor (CF vs rank): checked when the controller binds


class GravacModeConfig(StrictModel):
    """``mode: "gravac"``: the GraVAC controller's keys, ``"gravac": {"gravac": {...}}`` (top-level keys until
    0.5, still accepted with a warning: config_aliases.py)."""

    theta_min: float = Field(10.0, ge=1)
    theta_max: float = Field(1000.0, gt=1)
    epsilon: float = Field(0.7, gt=0)
    omega: float = Field(0.01, ge=0, lt=1)
    window: int = Field(500, ge=1)
    scaling_policy: Literal["exponential", "geometric"] = "exponential"
    step_size: float = Field(2.0, gt=1)
    ewma_alpha: Optional[float] = Field(None, gt=0, le=1)
    ewma_alpha_range: list[float] = Field(default_factory=lambda: [0.01, 0.5])
    gain_ewma: Literal["ratio_of_ewmas", "ewma_of_ratio"] = "ratio_of_ewmas"
    gain_denominator: Literal["ef", "raw", "aggregate"] = "ef"
    # "uniform": over a low-rank compressor, GraVAC's levels are one rank for every matrix (64 … 1) with the
    # classifier pinned at >= the compressor's rank; "cf" maps one CF to a rank per matrix (docs/algorithms.md §7)
    rank_ladder: Literal["cf", "uniform"] = "cf"
    decision: Literal["pipelined", "strict"] = "pipelined"
    decision_source: Literal["allreduce", "rank0"] = "allreduce"
    stale_policy: Literal["refresh", "keep"] = "refresh"
    refresh_steps: int = Field(20, ge=0)
    min_sent_steps: int = Field(10, ge=1)
    settled_policy: Literal["freeze", "recheck"] = "freeze"

    @field_validator("ewma_alpha_range")
    @classmethod
    def _alpha_range(cls, v: list[float]) -> list[float]:
        if len(v) != 2:
            raise ValueError(f"ewma_alpha_range must be [lo, hi], got {len(v)} values")
        lo, hi = v
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"ewma_alpha_range ({lo}, {hi}) must satisfy 0 < lo <= hi <= 1")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "GravacModeConfig":
        if self.theta_min >= self.theta_max:
            raise ValueError(f"theta_min ({self.theta_min:g}) must be < theta_max "
                             f"({self.theta_max:g})")
        if self.window < 2 * self.refresh_steps:
            raise ValueError(f"window ({self.window}) must be >= 2 * refresh_steps = "
                             f"{2 * self.refresh_steps} (refresh_steps is {self.refresh_steps})")
        return self


class AutoConfig(StrictModel):
    """``mode: "auto"``: the budgeted goodput controller (docs/algorithms.md §8, keys: docs/configuration.md)."""

    interval_steps: int = Field(50, ge=1, le=100000)            # I: a decision every I steps
    sample_steps: int = Field(4, ge=1, le=100000)               # K: low rank measures K steps before a decision
    warmup_steps: int = Field(50, ge=0, le=10**7)               # dense steps before the first decision
    tight_steps: Optional[int] = Field(None, ge=0, le=10**7)    # tight budget after the start and an lr drop (None: I)
    lr_drop: float = Field(0.2, gt=0.0, le=1.0)                 # a step-to-step lr decrease by this fraction is a drop
    dwell: int = Field(2, ge=0, le=1000)                        # decisions a group keeps a new level
    min_gain: float = Field(0.03, ge=0.0, lt=1.0)               # predicted saving needed to switch
    budget_quiet: float = Field(1.0, gt=0.0, le=4.0)            # β: error budget in units of the reference's error
    budget_tight: float = Field(0.25, ge=0.0, le=4.0)
    tight_time_slack: Optional[float] = Field(None, ge=0.0, le=1.0)  # tight β only while the step stays this close
    group_cap: Optional[float] = Field(2.0, ge=1.0, le=100.0)    # no group above cap·β·its reference error (null: off)
    exact_fraction: float = Field(0.01, ge=0.0, le=0.1)    # low rank: unsent on the dense start that counts as exact
    pin_below_numel: int = Field(16384, ge=0)                   # groups smaller than this keep >= the reference
    efficiency_floor: float = Field(0.99, gt=0.0, le=1.0)       # quantizers: quiet budget S·(1/E − 1) of variance
    dense_dtype: Literal["bf16", "fp16", "engine"] = "bf16"     # the dense rung's all-reduce (engine: its dtype)
    buckets: Literal["groups", "shared"] = "groups"            # low rank: buckets per group, or the engine's plan
    link: Literal["measure", "nominal"] = "measure"             # time the all-reduce at attach, or assume:
    remeasure_decisions: int = Field(2, ge=0, le=100000)       # "measure": re-time the link every k decisions
    refit_tolerance: Optional[float] = Field(0.03, gt=0.0, le=1.0)   # "measure": re-time when a step is this far off
    trial_hold_max: int = Field(16, ge=0, le=1000)              # "measure": a mixed plan not measured faster holds
    detector_eta: Optional[float] = Field(0.5, gt=0.0, le=100.0)  # Accordion's norm-change rule per group (null: off)
    link_gbit_s: float = Field(1.0, gt=0.0, le=10000.0)         # a nominal link (deterministic plans)
    link_alpha_s: float = Field(1e-3, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _tight_below_quiet(self) -> "AutoConfig":
        if self.budget_tight > self.budget_quiet:
            raise ValueError(f"auto.budget_tight ({self.budget_tight:g}) must be <= auto.budget_quiet "
                             f"({self.budget_quiet:g}): the tight budget allows less error")
        return self


class CostModelConfig(StrictModel):
    calibrate: bool = True
    probe_bytes: list[int] = Field(default_factory=lambda: [16384, 262144, 2097152])
    probe_repeats: int = Field(3, ge=1, le=20)
    refit_interval: int = Field(200, ge=0)
    max_chunks: int = Field(1, ge=1, le=64)       # most pipeline chunks the plan may split a compressed bucket into
    margin: float = Field(0.9, gt=0, le=1)

    @field_validator("probe_bytes")
    @classmethod
    def _probe_sizes(cls, v: list[int]) -> list[int]:
        if len(set(v)) < 2 or any(not 1024 <= x <= 67108864 for x in v):
            raise ValueError("cost_model.probe_bytes needs >= 2 distinct sizes in [1024, 67108864]")
        return v


class TelemetryConfig(StrictModel):
    timing: bool = True
    jsonl: Optional[str] = None
    wandb: bool = True

    @field_validator("jsonl")
    @classmethod
    def _jsonl_path(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.strip():    # "" would silently write no file at all
            raise ValueError(f"telemetry.jsonl {v!r} is no path; give a file path (with {{rank}} for one file per "
                             f"rank) or null for no file")
        return v


class CheckpointConfig(StrictModel):
    per_rank_files: bool = True
    on_world_size_change: Literal["reset", "error"] = "reset"


class DebugConfig(StrictModel):
    """Switches for diagnosing hangs; config keys (never per-rank environment variables), so every rank agrees."""

    check_plans: bool = False     # all-reduce a hash of every step's bucket actions and fail on a mismatch
    agreement_check_interval: int = Field(0, ge=0)   # every K steps, compare a checksum of the controller state


class GravacConfig(StrictModel):
    # general
    enabled: bool = True
    # defaults chosen by measurement (docs/algorithms.md §8, "On the short tasks"; BENCHMARKS_HISTORY.md §3.22):
    # since 0.5 mode "auto" over PowerSGD after a 50-step dense start (_auto_defaults), inside the noise floor on
    # VGG16-bn, the LSTM and the MLP and with DeepSpeed's bf16 all-reduce on ResNet101; "mode": "static" keeps 0.4's
    # static QSGD 8-bit (§3.14); per-model settings are ds_configs/<model>_recommended.json
    mode: Literal["gravac", "static", "accordion", "dense", "auto"] = "auto"
    compressor: CompressorSpec = Field(default_factory=CompressorSpec)
    # static mode's level; null: the compressor's own (a quantizer's grid default, e.g. QSGD 8-bit = CF 4; 100
    # for a sparsifier: SPARSIFIER_CF)
    cf: Optional[float] = Field(None, ge=1)
    warmup_steps: int = Field(0, ge=0)
    error_feedback: bool = True
    # clip each rank's gradient per tensor at gradient_clipping/√N before compression, instead of DeepSpeed clipping
    # the averaged update (what DGC always does; compress/local_clipping.py)
    local_clipping: bool = False
    seed: int = Field(0, ge=0, le=2**31 - 1)
    log_interval: int = Field(1, ge=0)
    # mode "static": measure the sent level's gain (a diagnostic, no decision reads it) every n-th step; decoding
    # it again costs 2–3% of a QSGD step on ResNet101 (docs/configuration.md)
    gain_interval: int = Field(10, ge=0)
    gravac: GravacModeConfig = Field(default_factory=GravacModeConfig)   # mode "gravac"'s keys
    accordion: AccordionConfig = Field(default_factory=AccordionConfig)
    auto: AutoConfig = Field(default_factory=AutoConfig)
    # synchronization
    bucket_cap_mb: float = Field(25.0, gt=0, le=2048)
    min_compress_numel: int = Field(0, ge=0)
    selection: Literal["threshold", "cost_model"] = "threshold"
    overlap: bool = True
    bulk: bool = True
    sparse_fallback: bool = True
    quantized_exchange: Literal["auto", "ps", "allgather"] = "auto"
    cost_model: CostModelConfig = Field(default_factory=CostModelConfig)
    # faults
    nonfinite: Literal["dense", "raise"] = "dense"
    timeout_s: float = Field(300.0, gt=0, le=86400)
    # telemetry, checkpoints, diagnostics
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)

    @model_validator(mode="before")
    @classmethod
    def _auto_defaults(cls, data: Any) -> Any:
        """Under ``mode: "auto"`` (the default since 0.5) an unset compressor type is :data:`AUTO_COMPRESSOR` and
        an unset ``min_compress_numel`` :data:`AUTO_MIN_COMPRESS_NUMEL`; ``{"mode": "static"}`` keeps version
        0.4's ``{}`` (QSGD 8-bit on every tensor)."""
        if not isinstance(data, Mapping) or data.get("mode", "auto") != "auto":
            return data
        out = {"min_compress_numel": AUTO_MIN_COMPRESS_NUMEL, **data}
        spec = out.get("compressor")
        if spec is None:
            out["compressor"] = {"type": AUTO_COMPRESSOR}
        elif isinstance(spec, Mapping) and "type" not in spec:
            out["compressor"] = {"type": AUTO_COMPRESSOR, **spec}
        return out

    @field_validator("compressor", mode="before")
    @classmethod
    def _bare_compressor_name(cls, v: Any) -> Any:
        return {"type": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _cross_field(self) -> "GravacConfig":
        if self.mode == "accordion" and self.accordion.interval_steps is None:
            raise ValueError("accordion.interval_steps is required when mode is 'accordion'")
        if self.mode == "auto" and self.auto.buckets == "shared" and self.compressor.type in ("qsgd", "topk"):
            raise ValueError(f"auto.buckets 'shared' needs a low-rank compressor (compressor {self.compressor.type!r} "
                             f"encodes a bucket at one level, so each layer group needs buckets of its own); "
                             f"allowed with it: 'groups'")
        return self

    def static_cf(self) -> float:
        """The CF static mode asks a CF-levelled compressor for when the config sets none."""
        return SPARSIFIER_CF if self.cf is None else float(self.cf)

    def normalized(self) -> dict[str, Any]:
        """Canonical, JSON-serialisable form used for hashing and checkpoints."""
        return json.loads(self.model_dump_json())

    def config_hash(self) -> int:
        return stable_hash(json.dumps(self.normalized(), sort_keys=True))


def unavailable_settings(config: GravacConfig) -> list[str]:
    """Settings the schema accepts but this version cannot honour, one message each (key, value, what to use).

    They are refused at attach rather than silently ignored: a user who sets them expects them to act."""
    out = []
    if config.gravac.decision_source == "rank0":
        out.append("decision_source 'rank0' (key gravac.decision_source): not available in this version; the "
                   "default 'allreduce' already gives every rank identical decisions")
    unused = sorted(config.cost_model.model_fields_set - _cost_model_keys_read(config))
    if "cost_model" in config.model_fields_set and unused:
        keys = ", ".join(f"cost_model.{k} {json.dumps(getattr(config.cost_model, k))}" for k in unused)
        out.append(f"{keys}: only used with selection 'cost_model' (selection is '{config.selection}'; "
                   f"probe_bytes and probe_repeats also with mode 'auto' and auto.link 'measure'); set "
                   f"\"selection\": \"cost_model\" or remove the cost_model section")
    if not config.telemetry.timing:
        out.append("telemetry.timing false: not available in this version (timing cannot be switched off: GraVAC's "
                   "controller and the step records need it); remove the key")
    return out


AUTO_PROBE_KEYS = frozenset({"probe_bytes", "probe_repeats"})     # what auto's link measurement reads


def _cost_model_keys_read(config: "GravacConfig") -> frozenset[str]:
    """The ``cost_model`` keys this config acts on: all with the cost-model selection, the probes when auto
    times the link, none otherwise."""
    if config.selection == "cost_model":
        return frozenset(CostModelConfig.model_fields)
    if config.mode == "auto" and config.auto.link == "measure":
        return AUTO_PROBE_KEYS
    return frozenset()


KEEP_AUTO = frozenset({"mode"})     # keys whose value "auto" is a choice ("mode": "auto"), not "not set"


def _drop_auto(value: Any, top: bool = True) -> Any:
    """``"auto"`` means "not set" (DeepSpeed's non-strict mode; HF fills or leaves it), except for the top-level
    keys of :data:`KEEP_AUTO`, where it names a choice."""
    if isinstance(value, Mapping):
        return {k: _drop_auto(v, False) for k, v in value.items()
                if not (isinstance(v, str) and v == "auto" and not (top and k in KEEP_AUTO))}
    return value


def parse_config(section: Union[Mapping[str, Any], GravacConfig, None], warn: bool = True) -> GravacConfig:
    """Validate a ``"gravac"`` section (dict or model); never mutates the caller's dict. Deprecated keys move to
    their new names, with a warning unless ``warn`` is false (a checkpoint's saved section)."""
    if isinstance(section, GravacConfig):
        return section
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise GravacConfigError(f'ds_gravac: the "gravac" section must be an object, got {type(section).__name__}')
    try:
        return GravacConfig.model_validate(migrate(_drop_auto(dict(section)), warn=warn))
    except ValidationError as exc:
        raise GravacConfigError(f'ds_gravac: invalid "gravac" config: {_keys_of(exc, section)}{_text(exc)}'
                                f'{_ranges(exc)}{_suggestions(exc)}') from None


def _text(exc: ValidationError) -> str:
    """pydantic's message without its web links (every key is documented in docs/configuration.md)."""
    return "\n".join(line for line in str(exc).splitlines() if "errors.pydantic.dev" not in line)


_BOUNDS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}


def _field_at(loc: tuple[Any, ...]) -> Optional[Any]:
    """The pydantic field a key path names (nested sections walked), or None."""
    model: Any = GravacConfig
    field = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = field.annotation
    return field


def _ranges(exc: ValidationError) -> str:
    """For a value out of its bounds, the key's whole allowed range (pydantic names only the bound violated)."""
    lines = []
    for err in exc.errors():
        if err["type"] not in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            continue
        field = _field_at(tuple(err["loc"]))
        bounds = [f"{_BOUNDS[k]} {getattr(m, k):g}" for m in (field.metadata if field else ())
                  for k in _BOUNDS if getattr(m, k, None) is not None]
        if bounds:
            lines.append(f"{'.'.join(str(p) for p in err['loc'])} allowed: {' and '.join(bounds)}")
    return "".join(f"\n{line}" for line in lines)


def _known_keys(model: type[BaseModel]) -> set[str]:
    """Every key name of the section, nested sections included."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        out.add(name)
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out |= _known_keys(kind)
    return out


def _suggestions(exc: ValidationError) -> str:
    """For an unknown key, the documented key it most resembles, and where every key is listed."""
    unknown = [str(err["loc"][-1]) for err in exc.errors() if err["type"] == "extra_forbidden" and err["loc"]]
    if not unknown:
        return ""
    hints = []
    for bad in unknown:
        near = difflib.get_close_matches(bad, sorted(_known_keys(GravacConfig)), n=1, cutoff=0.75)
        if near:
            hints.append(f'"{bad}": did you mean "{near[0]}"? ')
    return f"\n{''.join(hints)}(every key: docs/configuration.md)"


def _keys_of(exc: ValidationError, section: Mapping[str, Any]) -> str:
    """``"key a.b, c: "`` naming every key pydantic located an error at (its own text prints an empty key as
    nothing; here it is ``''``; a deprecated key as its new name, with the name written). Errors of cross-key
    rules have no location and name their keys themselves."""
    keys = dict.fromkeys(renamed_location(".".join(repr(p) if p == "" else str(p) for p in err["loc"]), section)
                         for err in exc.errors() if err["loc"])
    return f"key {', '.join(keys)}: " if keys else ""
