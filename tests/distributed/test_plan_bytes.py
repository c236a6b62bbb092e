"""The bytes ``python -m ds_gravac.plan`` prints for a config are the bytes a real 2-rank run of it sends: the
plan's totals against the step record of the first compressed step (step 1; step 0 is dense)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

ROOT = Path(__file__).resolve().parents[2]
CASES = {"qsgd": {"mode": "static"},                                   # two patterns (0.4's defaults; rank 4)
         "powersgd": {"mode": "static", "compressor": {"type": "powersgd", "params": {"rank": 4}}}}


def mlp() -> nn.Module:
    """Backward reaches the tensors in reverse registration order, so the buckets attach plans (the plan's) are
    the buckets step 0 freezes."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def config(section: dict) -> dict:
    return M.ds_config({**section, "bucket_cap_mb": 0.1})      # 26,214 values: several buckets


def _job(rank: int, world: int) -> dict[str, tuple[float, float]]:
    import ds_gravac

    out = {}
    for name, section in CASES.items():
        model = mlp()
        engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=config(section))
        M.train(engine, rank, 2)
        step1 = ds_gravac.get_handle(engine).pop_stats()[1]
        out[name] = (step1["bytes_sent"], step1["dense_bytes"])
        ds_gravac.detach(engine)
    return out


@pytest.fixture(scope="module")
def measured() -> list[dict[str, tuple[float, float]]]:
    return run_ranks(_job, 2)


@pytest.mark.parametrize("name", list(CASES))
def test_plan_bytes_are_the_run_s_bytes(measured: list[dict], name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config(CASES[name])))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(Path(__file__).parent)]),
               OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    out = subprocess.run([sys.executable, "-m", "ds_gravac.plan", str(path), "--model", "test_plan_bytes:mlp",
                          "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["rows"]) >= 3 and report["ratio"] < 0.5
    for rank_result in measured:
        assert (report["bytes_sent"], report["dense_bytes"]) == rank_result[name]
