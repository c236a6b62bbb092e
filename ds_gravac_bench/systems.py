"""The system matrix of the end-to-end benchmark: ids, runner flags and ``"gravac"`` sections.

Every system uses the same runner loop, model, data order, seed and base DeepSpeed config; only the
synchronization differs. Windows are scaled with the run length: ``window = steps // 10``,
``refresh_steps = min_sent_steps = window // 5``, Accordion ``interval_steps = steps // 10``. The GraVAC EWMA is
scaled with the window (``ewma_alpha = 2 / (window + 1)``, at most 0.5): the default α = N/100 = 0.02 at
N = 2 has a memory of ~50 steps, longer than a whole 30-step run, so the gains would never leave their seed.
``auto`` keeps its own defaults (a decision every 50 steps, tight for 50 steps after the start and every learning-rate
drop): the benchmark measures what ``"gravac": {}`` is to mean, and a tenth of a 6,000-step budget as its interval
would re-plan every 600 steps and keep it tight for the first 600 and 600 after each drop.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from runners.ddp_comm import POWERSGD
from runners.grad_jitter import MAX_REL as MAX_JITTER

MIN_NUMEL = 16384


@dataclass(frozen=True)
class SystemSpec:
    id: str
    system: str                    # runner --system: gravac | deepspeed | ddp | ddp_powersgd | ddp_bf16 | ddp_localsgd
    gravac: Optional[dict[str, Any]]
    note: str = ""
    runner_args: tuple[str, ...] = ()   # extra runner options (e.g. the PowerSGD rank)
    zero_stage: int = 0                 # the base config's zero_optimization.stage for this system
    ds_config: Optional[dict[str, Any]] = None  # top-level DeepSpeed keys set on the base config
    family: Optional[str] = None        # "baseline" for what users pick instead of compression (report column)
    params: Optional[dict[str, str]] = None     # @key=value variants of a system without a "gravac" section:
    #                                              key -> the runner option it sets (ddp_localsgd@period=16)
    dense_start: int = 0                # steps it all-reduces in fp32 before compressing (PowerSGD hook's start);
    #                                     recorded in meta.json so its cluster run prices them apart


def baseline_systems() -> list[SystemSpec]:
    """What users turn on instead of a compressor: 16-bit all-reduce in DeepSpeed or DDP, PyTorch's PowerSGD hook
    and PyTorch's post-local SGD (all PyTorch's or DeepSpeed's own implementations)."""
    half = [SystemSpec(f"ds_{dt}", "deepspeed", None, f"DeepSpeed, \"communication_data_type\": \"{dt}\"",
                       ds_config={"communication_data_type": dt}, family="baseline") for dt in ("fp16", "bf16")]
    return half + [
        SystemSpec("ddp_bf16", "ddp_bf16", None, "DDP + torch's bf16_compress_hook", family="baseline"),
        SystemSpec("ddp_localsgd", "ddp_localsgd", None, "torch post-local SGD: post_localSGD_hook + "
                   "PostLocalSGDOptimizer(PeriodicModelAverager), period 8 from step 0",
                   ("--localsgd-period", "8"), family="baseline",
                   params={"period": "--localsgd-period", "start": "--localsgd-start"}),
    ]


# Not a training system: every rank's process alone on its core, no communication (the report's T_compute).
COMPUTE_ONLY = SystemSpec("compute_only", "local", None, "one single-rank process per core at the same time, "
                          "no communication: the compute-only step of the physical bound")
# The same through a DeepSpeed engine (gradient all-reduce off): the compute-only step plus the engine's own work.
COMPUTE_ONLY_ENGINE = SystemSpec("compute_only_engine", "local_engine", None, "as compute_only, through a DeepSpeed "
                                 "engine with its gradient all-reduce off")


def _static(compressor: Any, cf: float, min_numel: int = MIN_NUMEL) -> dict[str, Any]:
    return {"mode": "static", "compressor": compressor, "cf": cf, "min_compress_numel": min_numel}


def _gravac_over(gravac: dict[str, Any], compressor: Any, **keys: Any) -> dict[str, Any]:
    """A GraVAC system's section over another compressor, with some of its ``gravac.*`` keys replaced."""
    return {**gravac, "compressor": compressor, "gravac": {**gravac["gravac"], **keys}}


def system_matrix(steps: int, epsilon: float = 0.7, theta_min: float = 10.0) -> dict[str, SystemSpec]:
    window = max(2, steps // 10)
    refresh = max(1, window // 5)
    gravac = {"mode": "gravac", "compressor": "topk", "min_compress_numel": MIN_NUMEL,
              "gravac": {"theta_min": theta_min, "theta_max": 1000, "epsilon": epsilon, "omega": 0.01,
                         "window": window, "refresh_steps": min(refresh, window // 2), "min_sent_steps": refresh,
                         "ewma_alpha": round(min(0.5, 2 / (window + 1)), 3)}}
    dgc = {"type": "dgc", "params": {"momentum": 0.9}}
    # without masking, dense steps keep DGC's momentum too (GraVAC's fallback would otherwise be SGD without it)
    dgc_nomask = {"type": "dgc", "params": {"momentum": 0.9, "momentum_masking": False, "dense_keeps_momentum": True}}
    specs = [
        COMPUTE_ONLY,
        COMPUTE_ONLY_ENGINE,
        SystemSpec("ds_dense", "deepspeed", None, "DeepSpeed's own all-reduce (after backward)"),
        SystemSpec("ds_dense_jitter", "deepspeed", None, "DeepSpeed dense, every averaged gradient multiplied by "
                   "1 + 1e-6*N(0,1): the noise floor of a per-seed loss gap", ("--grad-jitter", "1e-6")),
        SystemSpec("gv_dense", "gravac", {"mode": "dense"}, "ds_gravac dense: bucketed, overlapped"),
        SystemSpec("gv_default", "gravac", {}, "the product's defaults (\"gravac\": {}), whatever they are"),
        SystemSpec("gv_qsgd8", "gravac", {"mode": "static", "compressor": "qsgd"},
                   "static QSGD 8-bit on every tensor (the defaults of version 0.4)"),
        SystemSpec("ddp_dense", "ddp", None, "PyTorch DDP, 25 MB buckets"),
        *[SystemSpec(f"ddp_powersgd{tag}", "ddp_powersgd", None,
                     f"DDP + powerSGD_hook rank {rank} (bucket-serialized)", ("--powersgd-rank", str(rank)),
                     family="baseline", params={"rank": "--powersgd-rank"},
                     dense_start=POWERSGD["start_powerSGD_iter"]) for tag, rank in (("", 4), ("_r1", 1))],
        *baseline_systems(),
        *[SystemSpec(f"gv_topk_{cf}", "gravac", _static("topk", cf)) for cf in (10, 100, 1000)],
        *[SystemSpec(f"gv_dgc_{cf}", "gravac", _static(dgc, cf, 0)) for cf in (10, 100, 1000)],
        SystemSpec("gv_accordion_topk", "gravac",
                   {"mode": "accordion", "compressor": "topk", "min_compress_numel": MIN_NUMEL,
                    "accordion": {"interval_steps": window, "low_compression": 1.01, "high_compression": 10}},
                   "Accordion over Top-k CF 1.01/10"),
        SystemSpec("gv_gravac", "gravac", gravac, f"GraVAC Top-k exponential {theta_min:g}→1000, window {window}"),
        SystemSpec("gv_gravac_dgc", "gravac", {**gravac, "compressor": dgc, "min_compress_numel": 0}),
        # Momentum-factor masking zeroes u at every sent entry; at low CF that is most large entries each step, so
        # DGC degenerates to SGD without momentum (10x smaller effective lr at m = 0.9). These rows keep u.
        *[SystemSpec(f"gv_dgc_{cf}_nomask", "gravac", _static(dgc_nomask, cf, 0), f"DGC {cf}x, momentum_masking false")
          for cf in (10, 100, 1000)],
        SystemSpec("gv_gravac_dgc_nomask", "gravac", {**gravac, "compressor": dgc_nomask, "min_compress_numel": 0},
                   "GraVAC over DGC with momentum_masking false"),
        *lowrank_systems(gravac, window),
        SystemSpec("gv_auto", "gravac", {"mode": "auto", "compressor": "powersgd", "min_compress_numel": MIN_NUMEL},
                   "auto: per-group PowerSGD ranks or dense from the measured link and error: what {} runs"),
        SystemSpec("gv_auto_qsgd", "gravac", {"mode": "auto", "compressor": "qsgd", "min_compress_numel": MIN_NUMEL},
                   "auto: per-group QSGD bits (8/4/2) or dense from the measured link and variance"),
        SystemSpec("gv_auto_topk", "gravac", {"mode": "auto", "compressor": "topk", "min_compress_numel": MIN_NUMEL},
                   "auto: per-group Top-k CF (4/10/30/100) or dense from the measured link and unsent energy"),
        *quantizer_systems(gravac),
        *costmodel_systems(),
        *zero_systems(),
    ]
    return {s.id: s for s in specs}


def zero_systems() -> list[SystemSpec]:
    """ZeRO-1/2: DeepSpeed's own ZeRO reduction against ds_gravac dense and Top-k 100x taking it over (the same
    config otherwise; peak memory per rank is in every row, ZeRO-0's in ``ds_dense``/``gv_topk_100``)."""
    return [spec for stage in (1, 2) for spec in (
        SystemSpec(f"ds_zero{stage}", "deepspeed", None, f"DeepSpeed ZeRO-{stage}'s own reduction", zero_stage=stage),
        SystemSpec(f"gv_dense_zero{stage}", "gravac", {"mode": "dense"}, f"ds_gravac dense under ZeRO-{stage}",
                   zero_stage=stage),
        SystemSpec(f"gv_topk_100_zero{stage}", "gravac", _static("topk", 100), f"Top-k 100x under ZeRO-{stage}",
                   zero_stage=stage))]


def quantizer_systems(gravac: dict[str, Any]) -> list[SystemSpec]:
    """The quantizers in static mode at their own CF, over the parameter-server exchange (``_ps``) and, for 1-bit,
    over all-gather for comparison; the half-precision cast; GraVAC over the grids of TernGrad and QSGD."""
    def quant(comp: Any, exchange: str = "ps") -> dict[str, Any]:
        return {"mode": "static", "compressor": comp, "quantized_exchange": exchange, "min_compress_numel": MIN_NUMEL}
    return [
        SystemSpec("gv_onebit_ps", "gravac", quant("onebit"), "1-bit (mean |x|, worker + server EF), CaSync-PS"),
        SystemSpec("gv_onebit_allgather", "gravac", quant("onebit", "allgather"), "1-bit over all-gather"),
        SystemSpec("gv_terngrad_ps", "gravac", quant("terngrad"), "TernGrad 2-bit min/max, stochastic, CaSync-PS"),
        SystemSpec("gv_qsgd_ps", "gravac", quant("qsgd"), "QSGD 127 levels (8-bit codes), CaSync-PS"),
        SystemSpec("gv_fp16", "gravac", {"mode": "static", "compressor": "fp16", "min_compress_numel": MIN_NUMEL},
                   "fp16 all-reduce (pre-divided)"),
        *[SystemSpec(f"gv_gravac_{comp}_ps", "gravac",
                     {**_gravac_over(gravac, comp, theta_min=lo, theta_max=hi), "quantized_exchange": "ps"},
                     f"GraVAC over {comp}'s grid (CF {lo:g}→{hi:g}), CaSync-PS")
          for comp, lo, hi in (("terngrad", 4, 32), ("qsgd", 4, 16))],
    ]


def costmodel_systems() -> list[SystemSpec]:
    """Threshold against cost-model selection: the same static compressors with ``selection: "cost_model"`` and no
    size threshold, so the planner alone decides each bucket (and, for 1-bit, its exchange). Their threshold twins
    are ``gv_topk_100`` and ``gv_onebit_ps``; ``gv_topk_costmodel_chunks4`` also lets the plan send a bucket in
    up to 4 pipeline chunks (its twin: ``gv_topk_costmodel``)."""
    cm = {"selection": "cost_model", "min_compress_numel": 0}
    return [
        SystemSpec("gv_topk_costmodel", "gravac", {**_static("topk", 100), **cm},
                   "Top-k 100x, cost-model selection (threshold twin: gv_topk_100)"),
        SystemSpec("gv_topk_costmodel_chunks4", "gravac",
                   {**_static("topk", 100), **cm, "cost_model": {"max_chunks": 4}},
                   "Top-k 100x, cost-model selection with up to 4 pipeline chunks per bucket "
                   "(twin: gv_topk_costmodel)"),
        SystemSpec("gv_onebit_costmodel", "gravac",
                   {"mode": "static", "compressor": "onebit", "quantized_exchange": "auto", **cm},
                   "1-bit, cost-model selection of dense/compressed and CaSync-PS/all-gather per bucket "
                   "(threshold twin: gv_onebit_ps)"),
    ]


LOWRANK = ("powersgd", "acpsgd")
LOWRANK_THETA_MIN = 50.0      # ResNet101's large convolutions at rank ~9: the probe base stays cheap
# The error-feedback gain of a low-rank compressor collapses within a few steps (0.77 → 0.06 on ResNet101 at
# θ 20-40): each rank's error keeps its own deviation from the mean, which the sum of the factors cancels and
# never sends, so ‖x‖² grows while the sent energy does not. Against ‖g‖² ("raw") the gain stays meaningful.


def lowrank_systems(gravac: dict[str, Any], window: int) -> list[SystemSpec]:
    """PowerSGD and ACP-SGD at rank 1, 4 and 16, Accordion over ranks (4 in critical regimes, 1 otherwise) and GraVAC
    over ranks (θ mapped to a rank per matrix), each over both compressors."""
    out = []
    for comp in LOWRANK:
        for rank in (1, 4, 16):
            out.append(SystemSpec(f"gv_{comp}_r{rank}", "gravac",
                                  {"mode": "static", "compressor": {"type": comp, "params": {"rank": rank}},
                                   "min_compress_numel": MIN_NUMEL},
                                  f"{comp} rank {rank}"))
        out.append(SystemSpec(f"gv_{comp}_r16_cls1", "gravac",
                              {"mode": "static", "min_compress_numel": MIN_NUMEL,
                               "compressor": {"type": comp, "params": {"rank": 16, "classifier_rank": 1}}},
                              f"{comp} rank 16, the classifier at rank 1 (issue 42's M1)"))
        out.append(SystemSpec(f"gv_{comp}_theta10", "gravac",
                              _gravac_over(gravac, comp, theta_min=10.0, window=10**7, epsilon=1e-9,
                                           gain_denominator="aggregate"),
                              f"{comp} at CF 10 mapped to a rank per matrix: GraVAC whose window is never reached "
                              f"and whose ε test always passes (static θ 10, issue 42's M1)"))
        out.append(SystemSpec(f"gv_accordion_{comp}", "gravac",
                              {"mode": "accordion", "compressor": comp, "min_compress_numel": MIN_NUMEL,
                               "accordion": {"interval_steps": window}},
                              f"Accordion over {comp}: rank 4 in critical regimes, rank 1 otherwise"))
        out.append(SystemSpec(f"gv_gravac_{comp}", "gravac",
                              _gravac_over(gravac, comp, theta_min=LOWRANK_THETA_MIN, epsilon=0.3,
                                           gain_denominator="raw"),
                              f"GraVAC over {comp} ranks, θ {LOWRANK_THETA_MIN:g}→1000 mapped to ranks per matrix, "
                              f"raw gain, ε 0.3"))
    return out


def config_system(path: str, base: Optional[dict[str, Any]]) -> SystemSpec:
    """``cfg:<file>``: a shipped config's ``"gravac"`` section as a system (id = the file's stem). Its other keys must
    equal the base config's, so the comparison changes nothing but the synchronization."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"cfg:{path}: no such file")
    cfg = json.loads(file.read_text())
    if "gravac" not in cfg:
        raise ValueError(f"cfg:{path}: the config has no \"gravac\" section")
    if base is not None:
        differ = sorted(k for k in set(cfg) | set(base) if k != "gravac" and cfg.get(k) != base.get(k))
        if differ:
            raise ValueError(f"cfg:{path}: keys other than \"gravac\" differ from the base config: {', '.join(differ)}")
    return SystemSpec(file.stem, "gravac", cfg["gravac"], f"{file.name}")


def resolve_system(matrix: dict[str, SystemSpec], sid: str, base: Optional[dict[str, Any]] = None) -> SystemSpec:
    """``base@key=value@…``: a matrix system with keys of its "gravac" section overridden or added (values read as
    JSON; a dotted key such as ``compressor.params.rank`` reaches inside a nested object; a key renamed in 0.5 is
    read by its new name), so one invocation compares e.g. GraVAC at several ε, or with ``gravac.gain_denominator=raw``,
    against the same DeepSpeed dense run. Values are validated with the whole section before any cluster comes up.
    ``cfg:<file>`` is a config file's section (:func:`config_system`, checked against ``base``), and takes the same
    ``@key=value`` overrides (``cfg:ds_configs/bench/lstm_gravac_geo.json@warmup_steps=25``). ``@jitter=REL`` makes any
    such system its own noise control (:func:`_split_jitter`)."""
    head, *overrides = sid.split("@")
    if head.startswith("cfg:"):
        spec = config_system(head[4:], base)
    elif head not in matrix:
        raise ValueError(f"unknown system '{head}'; known: {', '.join(matrix)}")
    else:
        spec = matrix[head]
    given = overrides
    overrides, jitter = _split_jitter(sid, spec, overrides)
    if jitter:
        spec = replace(spec, runner_args=(*spec.runner_args, "--grad-jitter", jitter),
                       note=f"{spec.note}; noise control: every averaged gradient × (1 + {jitter}·N(0,1))")
    named = sid if not head.startswith("cfg:") else f"{spec.id}@{'@'.join(given)}"
    if not overrides:
        return replace(spec, id=named) if jitter else spec
    if spec.gravac is None and spec.params:
        return _with_runner_params(spec, sid, overrides)
    if spec.gravac is None:
        raise ValueError(f"system '{head}' has no \"gravac\" section to override ('{sid}')")
    from ds_gravac.config import GravacConfig
    from ds_gravac.config_aliases import RENAMED

    keys = sorted(GravacConfig.model_fields)
    section = copy.deepcopy(spec.gravac)
    for item in overrides:
        key, sep, raw = item.partition("=")
        path = key.split(".")
        if path[0] in RENAMED:         # ids written before 0.5 (@epsilon=0.1) name GraVAC's keys top-level
            path = [*RENAMED[path[0]][:2], *path[1:]]
        if not sep or path[0] not in keys:
            raise ValueError(f"'{sid}': expected @key=value with key a top-level \"gravac\" key "
                             f"({', '.join(keys)}) or a dotted path below one (compressor.params.rank), "
                             f"got '{item}'")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        _set_path(section, path, value)
    return replace(spec, id=named,
                   gravac=section, note=f"{spec.note} ({', '.join(overrides)})".lstrip())


def _split_jitter(sid: str, spec: SystemSpec, overrides: list[str]) -> tuple[list[str], Optional[str]]:
    """``X@jitter=1e-6``: system X with every averaged gradient multiplied by ``1 + 1e-6·N(0,1)`` (the runner's
    ``--grad-jitter``) — the noise control of X itself. Why: a compressed run's steps to target move far more under a
    perturbation of ten ulps than dense's do (``ds_dense_jitter``), so comparing two compressed systems needs their
    own floor. Returns the other overrides and the value (None without one)."""
    rest, jitter = [], None
    for item in overrides:
        key, _, raw = item.partition("=")
        if key != "jitter":
            rest.append(item)
            continue
        try:
            rel = float(raw)
        except ValueError:
            rel = math.nan
        if not 0.0 < rel <= MAX_JITTER:
            raise ValueError(f"'{sid}': jitter must be a number in (0, {MAX_JITTER}], got '{raw}'")
        if spec.system not in ("gravac", "deepspeed"):
            raise ValueError(f"'{sid}': jitter applies to DeepSpeed and ds_gravac systems, not {spec.system}")
        jitter = raw
    return rest, jitter


def jitter_of(sid: str) -> Optional[str]:
    """The ``jitter=`` value of a noise control's id, else None."""
    return next((o.partition("=")[2] for o in sid.split("@")[1:] if o.startswith("jitter=")), None)


def jitter_control_of(sid: str) -> Optional[str]:
    """The system a noise control ``X@jitter=…`` perturbs (X), else None."""
    head, *overrides = sid.split("@")
    rest = [o for o in overrides if not o.startswith("jitter=")]
    return "@".join([head, *rest]) if len(rest) < len(overrides) else None


def _with_runner_params(spec: SystemSpec, sid: str, overrides: list[str]) -> SystemSpec:
    """``ddp_localsgd@period=16``: a parameter of a system without a "gravac" section, passed as its runner
    option (later options win over the spec's own, as argparse takes the last)."""
    params = spec.params or {}
    extra: list[str] = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or key not in params or not raw.isdigit():
            raise ValueError(f"'{sid}': expected @key=<integer> with key one of {', '.join(sorted(params))}, "
                             f"got '{item}'")
        extra += [params[key], raw]
    return replace(spec, id=sid, runner_args=(*spec.runner_args, *extra),
                   note=f"{spec.note} ({', '.join(overrides)})")


def _set_path(section: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``section[a][b]... = value``; a compressor given by name becomes ``{"type": name, "params": {}}``."""
    node = section
    for part in path[:-1]:
        child = node.get(part)
        if isinstance(child, str) and part == "compressor":
            child = {"type": child, "params": {}}
        if not isinstance(child, dict):
            child = {}
        node[part] = child
        node = child
    node[path[-1]] = value


def system_config(base: dict[str, Any], spec: SystemSpec) -> dict[str, Any]:
    """The DeepSpeed config one system runs: the base without its "gravac" section, plus the system's."""
    cfg = copy.deepcopy(base)
    cfg.pop("gravac", None)
    if spec.zero_stage:      # SGD is outside DeepSpeed's list of ZeRO-tested optimizers, hence the flag
        cfg["zero_optimization"] = {**cfg.get("zero_optimization", {}), "stage": spec.zero_stage}
        cfg["zero_allow_untested_optimizer"] = True
        _drop_constant_torch_scheduler(cfg, spec.id)
    if spec.ds_config:
        cfg.update(copy.deepcopy(spec.ds_config))
    if spec.gravac is not None:
        cfg["gravac"] = copy.deepcopy(spec.gravac)
    return cfg


def _drop_constant_torch_scheduler(cfg: dict[str, Any], sid: str) -> None:
    """DeepSpeed hands a torch scheduler its ZeRO optimizer, which is no ``torch.optim.Optimizer`` ("... is not an
    Optimizer"). The shipped CIFAR configs' ``MultiStepLR`` starts decaying at step 9000, far past any benchmark
    budget, so without it the learning rate is the same; any other torch scheduler is refused."""
    sched = cfg.get("scheduler") or {}
    if sched.get("type") != "MultiStepLR":
        return
    if min(sched.get("params", {}).get("milestones", [0])) < 1000:
        raise ValueError(f"system '{sid}': ZeRO cannot run the torch scheduler MultiStepLR whose milestones fall "
                         f"inside a benchmark budget; use a DeepSpeed scheduler in the base config")
    cfg.pop("scheduler")


def ablation_ladder(compressor: str, cf: float) -> dict[str, SystemSpec]:
    """HiPress Fig. 11-style ladder for one static compressor: the compute-only step, DeepSpeed
    dense (the reference of every ratio), ds_gravac dense, then the compressor without overlap and without bulk decode, ``+overlap``,
    ``+bulk``, ``+cost_model`` (``selection: "cost_model"`` on top of the full ladder)."""
    comp: Any = {"type": "dgc", "params": {"momentum": 0.9}} if compressor == "dgc" else compressor
    base = _static(comp, cf, 0 if compressor == "dgc" else MIN_NUMEL)
    tag = f"{compressor}_{cf:g}"
    rungs = [("plain", False, False), ("overlap", True, False), ("overlap_bulk", True, True)]
    specs = [COMPUTE_ONLY,
             SystemSpec("ds_dense", "deepspeed", None, "DeepSpeed's own all-reduce (after backward)"),
             SystemSpec("gv_dense", "gravac", {"mode": "dense"}, "ds_gravac dense: bucketed, overlapped"),
             *[SystemSpec(f"abl_{tag}_{name}", "gravac", {**base, "overlap": overlap, "bulk": bulk},
                          f"{compressor} {cf:g}x, overlap {overlap}, bulk decode {bulk}")
               for name, overlap, bulk in rungs],
             SystemSpec(f"abl_{tag}_overlap_bulk_costmodel", "gravac",
                        {**base, "overlap": True, "bulk": True, "selection": "cost_model"},
                        f"{compressor} {cf:g}x, overlap, bulk decode, cost-model selection")]
    return {s.id: s for s in specs}


SMOKE_SYSTEMS = ("compute_only", "ds_dense", "gv_topk_100")
QUICK_SYSTEMS = ("compute_only", "ds_dense", "gv_dense", "ddp_dense", "gv_topk_100", "gv_gravac")
