"""Every shipped DeepSpeed config states the settings whose defaults bite."""
from __future__ import annotations

import glob
import json
import math
import os

import pytest
import torch

from ds_gravac.compress.acpsgd import ACPSGD
from ds_gravac.compress.powersgd import PowerSGD
from ds_gravac.config import parse_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIR = os.path.join(ROOT, "ds_configs")
# both levels: the files a user starts from (top level) and the benchmark's grid (bench/)
CONFIGS = sorted(glob.glob(os.path.join(DIR, "*.json")) + glob.glob(os.path.join(DIR, "bench", "*.json")))
IDS = [os.path.relpath(p, DIR).replace(os.sep, "/") for p in CONFIGS]     # "default.json", "bench/lstm_dense..."
TOP = [name for name in IDS if "/" not in name]
MODELS = ("resnet101", "vgg16", "lstm", "mlp")
# Which rule a file follows. "model": a runner model's file (<model>_*.json at either level, and bench/'s
# gravac_topk.json, a ResNet101 file): the runner conventions, and everything but "gravac" equal to
# <model>_dense.json, so that comparing two files compares only the synchronization. "resnet101": a starting point
# with ResNet101's hyper-parameters (make train's model) and the defaults, so everything but "gravac" (and, for
# zero2.json, the ZeRO keys) equals resnet101_dense.json. "own": an example script's file with its own
# hyper-parameters (runners/minimal_example.py, runners/train_hf.py), checked for the required keys only.
USER_FILES = {"default.json": "resnet101", "dense.json": "resnet101", "zero2.json": "resnet101",
              "minimal_topk.json": "own", "hf.json": "own"}
USER_SECTIONS = {"default.json": {}, "dense.json": {"mode": "dense"}, "zero2.json": {}}   # the defaults, nothing else
ZERO_KEYS = {"zero2.json": {"zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}}
# torch's LR schedulers (MultiStepLR) refuse DeepSpeed 0.19.8's ZeRO optimizer wrapper ("... is not an Optimizer")
NO_SCHEDULER = {"zero2.json"}
MODEL_OF = {"bench/gravac_topk.json": "resnet101"}


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rule(name: str) -> str:
    if name in USER_FILES:
        return USER_FILES[name]
    if name in MODEL_OF or os.path.basename(name).split("_")[0] in MODELS:
        return "model"
    raise AssertionError(f"ds_configs/{name}: no lint rule applies; add it to USER_FILES or name it <model>_*.json")


def model_of(name: str) -> str:
    return MODEL_OF.get(name, os.path.basename(name).split("_")[0])


def test_configs_exist() -> None:
    names = set(IDS)
    for model in ("resnet101", "vgg16", "lstm"):
        for kind in ("topk_10x", "topk_1000x", "dgc_10x", "dgc_1000x", "redsync_10x", "redsync_1000x",
                     "randomk_10x", "randomk_1000x", "accordion", "gravac_exp", "gravac_geo",
                     "powersgd_r1", "powersgd_r4", "acpsgd_r1", "acpsgd_r4", "accordion_powersgd",
                     "accordion_acpsgd", "gravac_powersgd", "gravac_acpsgd"):
            assert f"bench/{model}_{kind}.json" in names
        assert f"{model}_dense.json" in names and f"{model}_recommended.json" in names
    assert "bench/gravac_topk.json" in names and "mlp_dense.json" in names
    assert set(USER_FILES) <= names


def test_top_level_holds_at_most_12_files_each_under_a_rule() -> None:
    """The top level is what a user starts from (ds_configs/README.md's table); every file, at either level, is
    checked by a named rule rather than skipped."""
    assert len(TOP) <= 12, TOP
    assert ({name: rule(name) for name in IDS if name.startswith("bench/")} ==
        {name: "model" for name in IDS if name.startswith("bench/")})
    assert all(rule(name) in ("model", "resnet101", "own") for name in TOP)


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_config_sets_the_required_keys(path: str) -> None:
    cfg = _load(path)
    name = os.path.relpath(path, DIR).replace(os.sep, "/")
    assert "gradient_clipping" in cfg, "DeepSpeed 0.19.8 clips at 1.0 unless gradient_clipping is set"
    stage = ZERO_KEYS.get(name, {}).get("zero_optimization", {}).get("stage", 0)
    assert cfg.get("zero_optimization", {}).get("stage") == stage
    assert not (isinstance(cfg.get("wandb"), dict) and cfg["wandb"].get("enabled")),(
        "DeepSpeed's wandb monitor conflicts with the runner's run")
    assert "gravac" in cfg
    parse_config(cfg["gravac"])


@pytest.mark.parametrize("name", sorted(USER_SECTIONS))
def test_user_files_run_the_defaults(name: str) -> None:
    assert _load(os.path.join(DIR, name))["gravac"] == USER_SECTIONS[name]


def _vgg16_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """VGG16-bn's parameter shapes as the runners build it (on the meta device: no memory, no init cost)."""
    from runners.models import build_model
    with torch.device("meta"):
        model = build_model("vgg16")
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def _check_classifier_only(cfg: dict, gravac) -> None:
    """What the file compresses on the runners' VGG16-bn is exactly its classifier matrices, each at a rank ≥ the
    benchmark's global batch — the rank of their gradient, which PowerSGD then sends exactly."""
    shapes = _vgg16_shapes()
    compressed = [(name, shape) for name, shape in shapes if math.prod(shape) >= gravac.min_compress_numel]
    assert compressed and all(name.startswith("classifier.") and len(shape) == 2 for name, shape in compressed)
    assert all(math.prod(shape) < gravac.min_compress_numel for name, shape in shapes if name.startswith("features."))
    global_batch = 2 * cfg["train_micro_batch_size_per_gpu"]   # the benchmark's 2 ranks
    comp = {"powersgd": PowerSGD, "acpsgd": ACPSGD}[gravac.compressor.type]()
    comp.bind_levels("cf", 2.0)                 # the compressor's own CF -> rank mapping
    for name, (n, m) in compressed:
        if gravac.mode == "static":
            rank = min(gravac.compressor.params["rank"], n, m)
        else:   # GraVAC's first candidate, 2·θ_min
            rank = comp.rank_for(n, m, 2 * gravac.gravac.theta_min)
        assert rank >= global_batch, (name, rank)


@pytest.mark.parametrize("path", [p for p, i in zip(CONFIGS, IDS) if rule(i) == "model"],
                         ids=[i for i in IDS if rule(i) == "model"])
def test_runner_config_conventions(path: str) -> None:
    cfg = _load(path)
    # LSTMs are trained with clipping (ds_configs/README.md); the CNN configs state "off" explicitly
    name = os.path.relpath(path, DIR).replace(os.sep, "/")
    assert cfg["gradient_clipping"] == (0.25 if model_of(name) == "lstm" else 0.0)
    assert cfg["optimizer"]["type"] == "SGD" and cfg["optimizer"]["params"]["momentum"] == 0.9
    assert cfg["steps_per_print"] >= 100000
    gravac = parse_config(cfg["gravac"])
    if gravac.compressor.type == "dgc":
        assert gravac.min_compress_numel == 0, "DGC applies momentum itself: every tensor must be compressed"
        assert gravac.compressor.params["momentum"] == cfg["optimizer"]["params"]["momentum"]
    elif gravac.min_compress_numel != 16384:
        # the only other threshold: files that compress VGG16-bn's classifier matrices only, whose gradient has rank
        # <= the global batch, which PowerSGD recovers exactly at that rank; its convolutions (<= 2.36M values) go
        # dense (docs/BENCHMARKS_HISTORY.md §3.5)
        assert model_of(name) == "vgg16" and gravac.min_compress_numel == 3_000_000
        _check_classifier_only(cfg, gravac)
    else:
        assert gravac.min_compress_numel == 16384


def test_shipped_hyper_parameters() -> None:
    """The hyper-parameters ds_configs/README.md documents and justifies (the papers' batch sizes and weight
    decays; learning rates measured to learn at our 2-rank batch; clipping for the LSTM)."""
    r101 = _load(os.path.join(DIR, "resnet101_dense.json"))
    assert r101["train_micro_batch_size_per_gpu"] == 32
    assert r101["optimizer"]["params"] == {"lr": 0.001, "momentum": 0.9, "weight_decay": 1e-4}
    assert r101["scheduler"] == {"type": "MultiStepLR", "params": {"milestones": [9000, 14000], "gamma": 0.1}}
    vgg = _load(os.path.join(DIR, "vgg16_dense.json"))
    assert vgg["optimizer"]["params"] == {"lr": 0.001, "momentum": 0.9, "weight_decay": 5e-4}
    assert "scheduler" not in vgg
    lstm = _load(os.path.join(DIR, "lstm_dense.json"))
    assert lstm["train_micro_batch_size_per_gpu"] == 20 and "scheduler" not in lstm
    assert lstm["optimizer"]["params"] == {"lr": 2.0, "momentum": 0.9, "weight_decay": 1e-4}
    assert lstm["gradient_clipping"] == 0.25


@pytest.mark.parametrize("model", ["resnet101", "vgg16", "lstm", "mlp"])
def test_configs_of_a_model_differ_only_in_their_gravac_section(model: str) -> None:
    """Comparisons between configs (the fidelity benchmark, make train's dense reference) change nothing but the
    synchronization."""
    def rest(name: str, drop: set) -> dict:
        return {k: v for k, v in _load(os.path.join(DIR, name)).items() if k != "gravac" and k not in drop}
    others = [i for i in IDS if rule(i) == "model" and model_of(i) == model]
    if model == "resnet101":
        others += [i for i in IDS if rule(i) == "resnet101"]     # default.json, dense.json, zero2.json
    assert others
    for name in others:
        # zero2.json: ZeRO stage 2 and no scheduler, else resnet101_dense.json
        drop = set(ZERO_KEYS.get(name, {})) | ({"scheduler"} if name in NO_SCHEDULER else set())
        assert rest(name, drop) == rest(f"{model}_dense.json", drop), name
    for name, keys in ZERO_KEYS.items():
        assert {k: _load(os.path.join(DIR, name))[k] for k in keys} == keys, name
    assert not [name for name in NO_SCHEDULER if "scheduler" in _load(os.path.join(DIR, name))]
    exp = parse_config(_load(os.path.join(DIR, "bench", "resnet101_gravac_exp.json"))["gravac"]).gravac
    # ε 0.3 since the files run Top-k with momentum correction (a lower gain than error feedback's, docs/BENCHMARKS_HISTORY.md §3.5)
    assert ((exp.theta_min, exp.theta_max, exp.epsilon, exp.window, exp.scaling_policy) ==
        (10, 1000, 0.3, 500, "exponential"))
    geo = parse_config(_load(os.path.join(DIR, "bench", "resnet101_gravac_geo.json"))["gravac"]).gravac
    assert (geo.theta_max, geo.window, geo.scaling_policy) == (2000, 2000, "geometric")


def test_readme_lists_every_config() -> None:
    """The top-level table names each user file by its name, the grid's table each bench/ file by its path."""
    with open(os.path.join(DIR, "README.md"), encoding="utf-8") as f:
        text = f.read()
    missing = [name for name in IDS if f"`{name}`" not in text]
    assert not missing, missing


def test_lowrank_gravac_configs_use_the_aggregate_gain() -> None:
    """Under an all-reduced low-rank compressor the raw gain grows with the steps and the error-feedback gain
    collapses (docs/algorithms.md §7): only the averaged update's gain is sound."""
    lowrank = [p for p in CONFIGS if os.path.basename(p).endswith(("_gravac_powersgd.json", "_gravac_acpsgd.json"))]
    assert len(lowrank) == 6
    for path in lowrank:
        gravac = parse_config(_load(path)["gravac"])
        assert gravac.gravac.gain_denominator == "aggregate", path
        from ds_gravac.integration.engine import build_compressor
        from ds_gravac.sync.aggregate_gain import check_aggregate_gain
        check_aggregate_gain(gravac, build_compressor(gravac))      # raises if the compressor cannot report it
