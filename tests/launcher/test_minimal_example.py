"""The smallest real job under the real `deepspeed` launcher (2 CPU ranks)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.launcher
def test_minimal_example_under_deepspeed_launcher() -> None:
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    from harness import free_port
    cmd = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), "runners/minimal_example.py",
           "--deepspeed_config", "ds_configs/minimal_topk.json", "--steps", "30"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    match = re.search(r"ds_gravac summary: (\d+) optimizer steps, loss ([\d.]+) -> ([\d.]+)", proc.stdout)
    assert match, proc.stdout[-3000:]
    assert int(match.group(1)) == 30
    assert float(match.group(3)) < float(match.group(2)), "the synthetic task must be learnable"
    less = re.search(r"\(([\d.]+)x less\)", proc.stdout)
    assert less and float(less.group(1)) > 2
