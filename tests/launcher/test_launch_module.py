"""``deepspeed --module ds_gravac.launch script.py``: an unmodified, example-style DeepSpeed script is taken over
when its config has a "gravac" section: same final parameters as the script edited to call
``ds_gravac.initialize``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "launcher" / "scripts" / "ds_example_train.py"
DS = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16, "gradient_clipping": 0.0,
      "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}, "steps_per_print": 10**9}
GRAVAC = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 1000}


def _run(tmp: Path, name: str, config: dict, via_module: bool, edited: bool = False) -> dict:
    from harness import free_port
    cfg = tmp / f"{name}.json"
    cfg.write_text(json.dumps(config))
    out = tmp / f"{name}.pt"
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    target = ["--module", "ds_gravac.launch", str(SCRIPT)] if via_module else [str(SCRIPT)]
    cmd = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), *target,
           "--deepspeed_config", str(cfg), "--out", str(out), *(["--edited"] if edited else [])]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.launcher
def test_unmodified_script_is_taken_over_like_the_edited_one(tmp_path: Path) -> None:
    launched = _run(tmp_path, "launched", {**DS, "gravac": GRAVAC}, via_module=True)
    edited = _run(tmp_path, "edited", {**DS, "gravac": GRAVAC}, via_module=False, edited=True)
    assert launched["taken_over"] and edited["taken_over"]
    for name, p in edited["params"].items():
        assert torch.equal(launched["params"][name], p), name
    # engines without a "gravac" section are left alone: tests/distributed/test_initialize_patch.py (same code path)


def test_launch_module_usage_errors() -> None:
    from ds_gravac.launch import split_argv
    with pytest.raises(SystemExit, match="no script given"):
        split_argv(["--local_rank=0"])
    with pytest.raises(SystemExit, match="not found"):
        split_argv(["--local_rank=0", "missing_script.py"])
    assert split_argv(["--local_rank=1", str(SCRIPT), "--x"]) == (["--local_rank=1"], str(SCRIPT), ["--x"])
