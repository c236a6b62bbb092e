"""A loopback run leaves no rank behind: past ``--timeout`` it ends as a failed system with every rank stopped, and
an invocation interrupted or sent SIGTERM stops the ranks of the system it was running.

Before: ``subprocess.run(timeout=…)`` killed the launcher alone and raised ``TimeoutExpired``, which ended the whole
invocation (the systems after it never ran) and left both ranks training, orphaned, on the machine's two cores; a
``kill`` or ``pkill`` of the invocation left them the same way.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

SLEEPER = """
import os, sys, time
with open(os.path.join({out!r}, f"pid-{{os.getpid()}}"), "w") as fh:
    fh.write("started")
time.sleep(120)
"""
# Long enough for DeepSpeed's two launcher levels to start both ranks on a busy machine (at 8 s, with training beside
# the suite, 1 run in 3 timed out before any rank had started).
RUN_TIMEOUT = 20.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:          # a zombie is gone for our purpose (its parent reaps it)
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.launcher
@pytest.mark.parametrize("ddp", [True, False], ids=["torchrun", "deepspeed"])
def test_loopback_timeout_stops_every_rank_and_returns(tmp_path: Path, ddp: bool) -> None:
    from ds_gravac.integration.ports import free_port
    from ds_gravac_bench.e2e import run_local

    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER.format(out=str(pids)))
    log = tmp_path / "log.txt"
    deadline = time.monotonic() + 60 + RUN_TIMEOUT
    started = time.monotonic()
    rc = run_local(str(script), [], ddp, free_port(), RUN_TIMEOUT, log)
    took = time.monotonic() - started
    ranks = [int(p.name.split("-")[1]) for p in pids.iterdir()]
    assert len(ranks) == 2, f"expected both ranks to have started, got {ranks}: {log.read_text()[-2000:]}"
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if _alive(pid)], "a rank outlived its run's timeout"
    assert rc not in (0, None), rc
    assert took < RUN_TIMEOUT + 32, f"the run took {took:.0f} s to stop after a {RUN_TIMEOUT:g} s timeout"
    assert f"timed out after {RUN_TIMEOUT:g} s" in log.read_text()


@pytest.mark.launcher
def test_interrupted_loopback_run_stops_its_ranks(tmp_path: Path) -> None:
    """The ranks run in their own session (so that the timeout can stop their group), where a terminal's Ctrl-C no
    longer reaches them: the interrupted invocation stops them itself."""
    import signal
    import subprocess
    import sys

    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER.format(out=str(pids)))
    # The driver gets Ctrl-C as a terminal's foreground job does: a suite started as a background job (``make test &``
    # from a script) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt.
    driver = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "from pathlib import Path; from ds_gravac.integration.ports import free_port; "
              "from ds_gravac_bench.e2e import run_local; "
              f"run_local({str(script)!r}, [], True, free_port(), 300.0, Path({str(tmp_path / 'log.txt')!r}))")
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    ranks = [int(p.name.split("-")[1]) for p in pids.iterdir()]
    assert len(ranks) == 2, f"expected both ranks to have started, got {ranks}"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) != 0
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if _alive(pid)], "a rank outlived the interrupted invocation"


def _ranks_logging_to(log_dir: Path) -> list[int]:
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if any(str(log_dir) in arg for arg in cmd) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(proc.info["pid"])
    return out


@pytest.mark.launcher
@pytest.mark.parametrize("system", ["ds_dense", "compute_only"])
def test_sigterm_to_a_loopback_invocation_stops_its_ranks(tmp_path: Path, system: str) -> None:
    """``kill <pid>`` of ``e2e run`` (as ``pkill -f ds_gravac_bench.long_keep`` does) while a system trains: both
    ranks under a launcher, or compute_only's two single-rank processes."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    log_dir = out / "systems" / system
    cmd = [sys.executable, "-m", "ds_gravac_bench.e2e", "run", "--model", "tiny_cnn", "--rate", "loopback",
           "--steps", "100000", "--systems", system, "--micro-batch", "4", "--runner-extra=--eval-every -1",
           "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline")
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    try:
        steps = log_dir / "steps.jsonl"

        def logged() -> bool:
            return steps.is_file() and steps.read_text().count("\n") >= 3

        while time.monotonic() < deadline and proc.poll() is None and not logged():
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before it could be stopped"
        ranks = _ranks_logging_to(log_dir)
        assert len(ranks) >= 2, ranks                   # the launcher and both ranks name the log directory
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in ranks if _alive(pid)], "a rank outlived the invocation sent SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _ranks_logging_to(log_dir):
            os.kill(pid, signal.SIGKILL)
