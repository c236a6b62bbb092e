"""``--checkpoint-every``: a long benchmark run killed in the middle continues from its newest complete checkpoint
when the same command runs again, drops the records its checkpoint does not hold, recomputes them bitwise, and a
third invocation finds the system finished (tiny_cnn, real deepspeed launcher, loopback); on the emulated cluster,
a run stopped by SIGTERM takes its namespaces down and continues the same way."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_skip import emulated_cluster_unavailable

from ds_gravac_bench.resume import last_logged_step, resume_point

pytestmark = pytest.mark.launcher

ROOT = Path(__file__).resolve().parents[2]
STEPS, EVERY = 60, 5
SYSTEM = "gv_topk_100@min_compress_numel=1000"   # tiny_cnn's weights compressed: residuals a resume must restore
CLUSTER_TAG = 74


def _command(out: Path, rate: str = "loopback") -> list[str]:
    return [sys.executable, "-m", "ds_gravac_bench.e2e", "run", "--model", "tiny_cnn", "--rate", rate,
            "--steps", str(STEPS), "--systems", SYSTEM, "--micro-batch", "4", "--checkpoint-every", str(EVERY),
            "--runner-extra=--eval-every -1", "--tag", str(CLUSTER_TAG), "--out", str(out)]


def _records(log: Path) -> list[dict]:
    return [json.loads(x) for x in (log / "steps.jsonl").read_text().splitlines() if x.strip()]


def _interrupt(out: Path, log: Path, rate: str = "loopback") -> None:
    """Freeze the whole launch (launcher and ranks) once it has logged steps past a complete checkpoint, then end
    it: SIGKILL on loopback (what a power cut or a session's end leaves on disk); SIGTERM on the cluster, whose
    handler takes the namespaces down (SIGKILL would leave them for `cluster down`)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline")
    proc = subprocess.Popen(_command(out, rate), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if proc.poll() is not None:
                pytest.fail(f"the run ended (exit {proc.returncode}) before it could be interrupted")
            if (log / "ckpt").is_dir() and last_logged_step(log) > EVERY + 1:
                os.killpg(proc.pid, signal.SIGSTOP)
                ckpt = resume_point(log, ranks=2)
                if ckpt is not None and last_logged_step(log) > ckpt:
                    if rate != "loopback":
                        os.killpg(proc.pid, signal.SIGTERM)
                        os.killpg(proc.pid, signal.SIGCONT)
                        proc.wait(timeout=120)
                    return
                os.killpg(proc.pid, signal.SIGCONT)
        pytest.fail("no checkpoint followed by logged steps within 240 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("rate", ["loopback", "1gbit"])
def test_killed_long_run_continues_from_its_checkpoint(tmp_path: Path, rate: str) -> None:
    if rate != "loopback":
        reason = emulated_cluster_unavailable(tmp_path / "probe", CLUSTER_TAG)
        if reason:
            pytest.skip(reason)
    out = tmp_path / "run"
    log = out / "systems" / SYSTEM
    _interrupt(out, log, rate)
    if rate != "loopback":
        from ds_gravac_bench import netns
        assert netns.owned_existing(CLUSTER_TAG) == []                       # SIGTERM took the cluster down
    before = {r["step"]: r for r in _records(log)}
    ckpt = resume_point(log, ranks=2)
    assert ckpt is not None and max(before) > ckpt

    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline")
    again = subprocess.run(_command(out, rate), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{SYSTEM}: resuming after step {ckpt}" in again.stdout
    records = _records(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))          # each step once, none missing
    for step, old in before.items():                                          # kept, and recomputed bitwise
        assert records[step - 1]["loss"] == old["loss"], step
        assert records[step - 1]["bytes_sent"] == old["bytes_sent"], step
    assert sorted(p.name for p in (log / "ckpt").iterdir() if p.is_dir()) == [f"step{STEPS}"]
    recorded = json.loads((out / "meta.json").read_text())["systems"][SYSTEM]
    assert recorded["returncode"] == 0
    assert recorded["cpu_s"] > 0 and recorded["wall_s"] > 0     # the cost of the invocation that finished it
    if rate == "loopback":      # the third invocation's skip is the same code path on the cluster
        third = subprocess.run(_command(out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert third.returncode == 0 and f"{SYSTEM}: finished by an earlier invocation" in third.stdout
        assert _records(log) == records
        assert json.loads((out / "meta.json").read_text())["systems"][SYSTEM] == recorded
        # another system into the same directory keeps this one's record: test_baseline_systems.py (same code path)
