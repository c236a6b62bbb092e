"""The README's quick start works exactly as written: its script, launched with its command line."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def quick_start() -> tuple[str, list[str]]:
    """The quick start's Python block and the words of its ``deepspeed`` command line (the exit count of
    ``ds_gravac_bench.exits`` reads it the same way)."""
    from ds_gravac_bench.exits import readme_quick_start
    script, words = readme_quick_start(ROOT / "README.md")
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert ". .venv/bin/activate" in re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return script, words


@pytest.mark.launcher
def test_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    from harness import free_port
    script, words = quick_start()
    (tmp_path / "train.py").write_text(script)
    env = dict(os.environ, DS_ACCELERATOR="cpu", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    while "=" in words[0]:                       # leading VAR=value assignments
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[0] == "deepspeed" and "train.py" in words
    # run from the repository root (the config path is relative to it), the script from the temporary directory,
    # on a free port so concurrent jobs cannot collide
    words = [words[0], "--master_port", str(free_port()), *words[1:]]
    words[words.index("train.py")] = str(tmp_path / "train.py")
    proc = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    match = re.search(r"loss ([\d.]+), step (\d+), (\d+) of (\d+) bytes sent", proc.stdout)
    assert match, out[-3000:]
    assert int(match.group(2)) == 29
    # its 30 steps are auto's dense start (auto.warmup_steps 50): all-reduced in bf16, half of fp32's bytes
    assert int(match.group(3)) * 2 == int(match.group(4)), "the quick start runs inside auto's bf16 dense start"
