"""A peer that stops responding or dies ends every other rank with a ds_gravac error, within ``timeout_s``.

Real jobs under the real ``deepspeed`` launcher: two ``--no_ssh`` nodes of the emulated cluster or, where it cannot
run (no root or namespaces), one node with 2 CPU ranks. Rank 1 of ``fault_job.py`` sends itself SIGSTOP (a hung peer:
its sockets stay open, so only a timeout can notice) or SIGKILL (its sockets close at once) after a few steps.
The seconds from the fault to rank 0's error are printed (``pytest -s``) for the benchmark notes.
"""
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

ROOT = Path(__file__).resolve().parents[2]
JOB = "tests/launcher/fault_job.py"
TIMEOUT_S = 8.0          # the job's "timeout_s": short, so the test is quick
KILL_BOUND_S = 5.0       # a dead peer is noticed through its closed sockets, long before any timeout
FAULT_TAG = 75


def read_markers(directory: Path) -> dict[int, dict]:
    out = {}
    for rank in (0, 1):
        path = directory / f"rank{rank}.json"
        if path.exists():
            try:
                out[rank] = json.loads(path.read_text())
            except json.JSONDecodeError:       # being written
                pass
    return out


def check_outcome(fault: str, markers: dict[int, dict], log: str) -> float:
    """Rank 0 failed with a ds_gravac collective error, within the bound; returns the seconds it took."""
    assert 1 in markers and markers[1].get("fault") == fault, f"rank 1 never reached its fault:\n{log[-3000:]}"
    assert 0 in markers, f"rank 0 did not report:\n{log[-3000:]}"
    error = markers[0]["error"]
    assert error is not None, "rank 0 finished its loop although its peer was gone"
    assert "ds_gravac: collective" in error, error
    seconds = markers[0]["time"] - markers[1]["time"]
    bound = TIMEOUT_S + 10.0 if fault == "stop" else KILL_BOUND_S
    # rank 1 writes its marker after its last collective; on a busy host it may be descheduled in between, so
    # rank 0's wait can start a little before the marker's time (the lower bound still rules out an early error)
    lower = TIMEOUT_S - 3.0 if fault == "stop" else 0.0
    assert lower <= seconds <= bound, (fault, seconds, error)
    if fault == "stop":
        assert "timeout_s" in error, error
    print(f"\n[peer fault] {fault}: rank 0 failed {seconds:.1f} s after rank 1's fault: {error[:200]}")
    return seconds


def kill_stopped(markers: dict[int, dict]) -> None:
    pid = markers.get(1, {}).get("pid")
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def job_args(fault: str, markers: Path) -> list[str]:
    return ["--fault", fault, "--timeout-s", str(TIMEOUT_S), "--markers", str(markers)]


@pytest.mark.launcher
@pytest.mark.parametrize("fault", ["stop", "kill"])
def test_single_node(fault: str, tmp_path: Path) -> None:
    """The fallback where the emulated cluster cannot run (no root or namespaces): the same job on loopback. Where
    it can, ``test_two_nodes`` runs the same faults over real sockets between namespaces, and this one is skipped
    (it would add two launches and nothing the two-node runs do not show)."""
    if not emulated_cluster_unavailable(tmp_path / "probe", FAULT_TAG):
        pytest.skip("covered by test_two_nodes (the emulated cluster is available)")
    from harness import free_port
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    cmd = [deepspeed, "--num_gpus", "2", "--master_port", str(free_port()), JOB, *job_args(fault, tmp_path)]
    log_path = tmp_path / "launcher.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240 + TIMEOUT_S
        while time.monotonic() < deadline and 0 not in read_markers(tmp_path):
            time.sleep(0.2)
        markers = read_markers(tmp_path)
        kill_stopped(markers)
        returncode = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_stopped(read_markers(tmp_path))
    check_outcome(fault, markers, log_path.read_text(errors="replace"))
    assert returncode != 0


@pytest.mark.launcher
@pytest.mark.parametrize("fault", ["stop", "kill"])
def test_two_nodes(fault: str, tmp_path: Path) -> None:
    reason = emulated_cluster_unavailable(tmp_path / "probe", FAULT_TAG)
    if reason:
        pytest.skip(reason)
    from ds_gravac_bench import netns
    from ds_gravac_bench.cluster import EmulatedCluster
    markers_dir = tmp_path / "markers"
    markers_dir.mkdir()
    with EmulatedCluster(ranks=2, rate="1gbit", tag=FAULT_TAG, outdir=tmp_path / "cluster") as cluster:
        # a stopped rank 1 never exits by itself: once rank 0 has failed it is waited for only briefly (a killed
        # one fails first, and rank 0 keeps the usual grace to notice and exit)
        results = cluster.launch_deepspeed(JOB, job_args(fault, markers_dir), port=29631, timeout=240 + TIMEOUT_S,
                                           grace=2.0 if fault == "stop" else 10.0)
    markers = read_markers(markers_dir)
    kill_stopped(markers)
    check_outcome(fault, markers, "\n".join(r.text()[-2000:] for r in results))
    assert results[0].returncode not in (0, None)
    assert netns.owned_existing(FAULT_TAG) == []
