"""A user's script exits 0 without ``os._exit``: ds_gravac's exit hook destroys its own process groups while the
interpreter is whole (``ds_gravac/integration/teardown.py``), and leaves the default group alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
ROOT = Path(__file__).resolve().parents[2]


def test_a_script_without_teardown_exits_cleanly_and_releases_our_groups(tmp_path: Path) -> None:
    from harness import free_port
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
           "tests/launcher/scripts/exit_job.py", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"groups": 3, "live": [False, False, False], "channels_left": 0, "default_group": True}, seen
