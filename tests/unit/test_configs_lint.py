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
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "ds_configs", "*.json")))
IDS = [os.path.basename(p) for p in CONFIGS]


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_configs_exist() -> None:
    names = set(IDS)
    for model in ("resnet101", "vgg16", "lstm"):
        for kind in ("dense", "topk_10x", "topk_1000x", "dgc_10x", "dgc_1000x", "redsync_10x", "redsync_1000x",
                     "randomk_10x", "randomk_1000x", "accordion", "gravac_exp", "gravac_geo",
                     "powersgd_r1", "powersgd_r4", "acpsgd_r1", "acpsgd_r4", "accordion_powersgd",
                     "accordion_acpsgd", "gravac_powersgd", "gravac_acpsgd"):
            assert f"{model}_{kind}.json" in names
    assert "gravac_topk.json" in names


@pytest.mark.parametrize("path", CONFIGS, ids=IDS)
def test_config_sets_the_required_keys(path: str) -> None:
    cfg = _load(path)
    assert "gradient_clipping" in cfg, "DeepSpeed 0.19.8 clips at 1.0 unless gradient_clipping is set"
    assert cfg.get("zero_optimization", {}).get("stage") == 0
    assert not (isinstance(cfg.get("wandb"), dict) and cfg["wandb"].get("enabled")), \
        "DeepSpeed's wandb monitor conflicts with the runner's run"
    assert "gravac" in cfg
    parse_config(cfg["gravac"])


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
            rank = comp.rank_for(n, m, 2 * gravac.theta_min)
        assert rank >= global_batch, (name, rank)


@pytest.mark.parametrize("path", [p for p in CONFIGS if os.path.basename(p) != "minimal_topk.json"],
                         ids=[i for i in IDS if i != "minimal_topk.json"])
def test_runner_config_conventions(path: str) -> None:
    cfg = _load(path)
    # LSTMs are trained with clipping (ds_configs/README.md); the CNN configs state "off" explicitly
    assert cfg["gradient_clipping"] == (0.25 if os.path.basename(path).startswith("lstm_") else 0.0)
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
        assert os.path.basename(path).startswith("vgg16_") and gravac.min_compress_numel == 3_000_000
        _check_classifier_only(cfg, gravac)
    else:
        assert gravac.min_compress_numel == 16384


def test_shipped_hyper_parameters() -> None:
    """The hyper-parameters ds_configs/README.md documents and justifies (the papers' batch sizes and weight
    decays; learning rates measured to learn at our 2-rank batch; clipping for the LSTM)."""
    r101 = _load(os.path.join(ROOT, "ds_configs", "resnet101_dense.json"))
    assert r101["train_micro_batch_size_per_gpu"] == 32
    assert r101["optimizer"]["params"] == {"lr": 0.001, "momentum": 0.9, "weight_decay": 1e-4}
    assert r101["scheduler"] == {"type": "MultiStepLR", "params": {"milestones": [9000, 14000], "gamma": 0.1}}
    vgg = _load(os.path.join(ROOT, "ds_configs", "vgg16_dense.json"))
    assert vgg["optimizer"]["params"] == {"lr": 0.001, "momentum": 0.9, "weight_decay": 5e-4}
    assert "scheduler" not in vgg
    lstm = _load(os.path.join(ROOT, "ds_configs", "lstm_dense.json"))
    assert lstm["train_micro_batch_size_per_gpu"] == 20 and "scheduler" not in lstm
    assert lstm["optimizer"]["params"] == {"lr": 2.0, "momentum": 0.9, "weight_decay": 1e-4}
    assert lstm["gradient_clipping"] == 0.25


@pytest.mark.parametrize("model", ["resnet101", "vgg16", "lstm", "mlp"])
def test_configs_of_a_model_differ_only_in_their_gravac_section(model: str) -> None:
    """Comparisons between configs (the fidelity benchmark, make train's dense reference) change nothing but the
    synchronization."""
    def rest(path: str) -> dict:
        return {k: v for k, v in _load(path).items() if k != "gravac"}
    dense = rest(os.path.join(ROOT, "ds_configs", f"{model}_dense.json"))
    others = [p for p in CONFIGS if os.path.basename(p).startswith(f"{model}_")]
    if model == "resnet101":
        others.append(os.path.join(ROOT, "ds_configs", "gravac_topk.json"))
    assert others
    for path in others:
        assert rest(path) == dense, os.path.basename(path)
    exp = parse_config(_load(os.path.join(ROOT, "ds_configs", "resnet101_gravac_exp.json"))["gravac"])
    # ε 0.3 since the files run Top-k with momentum correction (a lower gain than error feedback's, docs/BENCHMARKS_HISTORY.md §3.5)
    assert (exp.theta_min, exp.theta_max, exp.epsilon, exp.window, exp.scaling_policy) == \
        (10, 1000, 0.3, 500, "exponential")
    geo = parse_config(_load(os.path.join(ROOT, "ds_configs", "resnet101_gravac_geo.json"))["gravac"])
    assert (geo.theta_max, geo.window, geo.scaling_policy) == (2000, 2000, "geometric")


def test_readme_lists_every_config() -> None:
    with open(os.path.join(ROOT, "ds_configs", "README.md"), encoding="utf-8") as f:
        text = f.read()
    missing = [name for name in IDS if f"`{name}`" not in text]
    assert not missing, missing
