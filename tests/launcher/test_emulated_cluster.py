"""Emulated multi-node cluster: shaped links, a 2-node ds_gravac job, and teardown on every exit.

Needs root and working network namespaces; skipped otherwise. Each test owns one tag, so tests are independent.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ds_gravac_bench import netns
from ds_gravac_bench.cluster import ROOT, EmulatedCluster, parse_sizes
from ds_gravac_bench.link_probe import fit_line, wire_factor
from ds_gravac_bench.netns import ClusterError

PROBE_TAG, JOB_TAG, SIGNAL_TAG, ERROR_TAG = 76, 77, 78, 79


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip unless we are root with ip/tc and can really build a namespace with a veth pair and a tbf qdisc."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_NET_ADMIN) to create network namespaces")
    try:
        netns.check_prereqs()
        netns.list_netns()
    except ClusterError as err:
        pytest.skip(f"`ip netns` unavailable: {err}")
    reason = netns.probe(tmp_path_factory.mktemp("probe"), PROBE_TAG)
    if reason:
        pytest.skip(f"cannot create network namespaces here: {reason}")


def pid_gone(pid: int, timeout: float = 15.0) -> bool:
    """True once ``pid`` has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_helpers_without_root() -> None:
    assert netns.burst_bytes("1gbit") == 256 * 1024 and netns.burst_bytes("100mbit") == 32 * 1024
    assert netns.burst_bytes("50mbit") >= 50e6 / 8 / 1000
    assert netns.parse_rate("1gbit") == 1e9 and netns.parse_delay("0.5ms") == pytest.approx(5e-4)
    with pytest.raises(ClusterError):
        netns.parse_rate("fast")
    assert parse_sizes("16KiB,1MiB,4096") == [16384, 1 << 20, 4096]
    assert wire_factor("all_reduce", 4) == 1.5 and wire_factor("all_gather", 4) == 3
    a, b = fit_line([1e3, 1e4, 1e5], [1e-4 + 2e-8 * x for x in (1e3, 1e4, 1e5)])
    assert a == pytest.approx(1e-4) and b == pytest.approx(2e-8)


@pytest.mark.launcher
def test_bandwidth_and_two_node_ds_gravac_job(namespaces: None, tmp_path: Path) -> None:
    rate, size = 50e6, 4 << 20
    with EmulatedCluster(ranks=2, rate="50mbit", tag=JOB_TAG, outdir=tmp_path) as cluster:
        assert cluster.hostfile.read_text() == "node0 slots=1\nnode1 slots=1\n"
        report = cluster.measure(sizes=[size], ops=("all_reduce",), port=29611, max_repeats=3, timeout=120)
        expected = wire_factor("all_reduce", 2) * size * 8 / rate          # ring volume / rate
        seconds = report["ops"]["all_reduce"]["seconds"][0]
        # Shaped: never faster than the wire allows (unshaped veth moves 4 MiB in milliseconds), and not at a
        # wrong rate (half the rate would take 2×). Gloo's protocol and a busy 2-core host add time above the
        # ideal: +36% was seen in a full-suite run on an Intel Xeon, so the upper slack is 1.8×, not 1.3×.
        assert 0.8 * expected < seconds < 1.8 * expected, (seconds, expected)

        tx_before = [cluster.tx_bytes(i) for i in range(2)]
        results = cluster.launch_deepspeed("runners/minimal_example.py",
                                           ["--steps", "3", "--deepspeed_config", "ds_configs/minimal_topk.json"],
                                           port=29612, timeout=240)
        assert all(res.ok for res in results), "\n".join(
            f"rank {res.rank} returned {res.returncode}:\n{res.text()[-2000:]}" for res in results)
        assert "ds_gravac summary:" in results[0].stdout.read_text()
        assert all(cluster.tx_bytes(i) > tx_before[i] for i in range(2))
    assert netns.owned_existing(JOB_TAG) == []


SIGNAL_SCRIPT = """
import sys, time
from ds_gravac_bench.cluster import EmulatedCluster
with EmulatedCluster(ranks=2, rate="100mbit", tag=int(sys.argv[1]), outdir=sys.argv[2]) as cluster:
    print(cluster.spawn(1, ["sleep", "300"]).pid, flush=True)
    time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_tears_down(namespaces: None, tmp_path: Path, sig: signal.Signals) -> None:
    driver = subprocess.Popen([sys.executable, "-c", SIGNAL_SCRIPT, str(SIGNAL_TAG), str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([driver.stdout], [], [], 60)
        assert ready, "the driver did not bring the cluster up within 60 s"
        sleeper = int(driver.stdout.readline())
        assert len(netns.owned_existing(SIGNAL_TAG)) == 3
        driver.send_signal(sig)
        driver.wait(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            netns.teardown(netns.StateFile(tmp_path, SIGNAL_TAG))
    assert driver.returncode != 0
    assert netns.owned_existing(SIGNAL_TAG) == []
    assert pid_gone(sleeper), "the process started in the namespace survived the teardown"


def test_exception_tears_down(namespaces: None, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with EmulatedCluster(ranks=2, rate="100mbit", tag=ERROR_TAG, outdir=tmp_path) as cluster:
            sleeper = cluster.spawn(0, ["sleep", "300"]).pid
            raise RuntimeError("boom")
    assert netns.owned_existing(ERROR_TAG) == []
    assert pid_gone(sleeper)


def test_refuses_stale_setup_and_down_is_idempotent(namespaces: None, tmp_path: Path) -> None:
    first = EmulatedCluster(ranks=2, rate="1gbit", tag=ERROR_TAG, outdir=tmp_path / "a")
    try:
        first.up()
        other = EmulatedCluster(ranks=2, rate="1gbit", tag=ERROR_TAG, outdir=tmp_path / "b")
        with pytest.raises(ClusterError, match="already exist"):
            other.up()
        assert other.down() == [] and len(netns.owned_existing(ERROR_TAG)) == 3   # not its names: untouched
        results = first.run_all([["sh", "-c", "ip -o -4 addr show eth0; grep Cpus_allowed_list /proc/self/status; "
                                  "tc qdisc show dev eth0; echo $GLOO_SOCKET_IFNAME"]] * 2, "probe", timeout=30)
        for rank, res in enumerate(results):
            out = res.stdout.read_text()
            assert res.ok and f"10.77.{ERROR_TAG}.{rank + 1}/24" in out and "tbf" in out and "eth0\n" in out
            assert f"Cpus_allowed_list:\t{first.core(rank)}" in out
    finally:
        first.down()
    assert first.down() == []
    assert netns.owned_existing(ERROR_TAG) == []
