"""Network-namespace helpers for the emulated cluster, with its safety rules built in.

Every namespace name carries the prefix ``gvc<T>-`` and is appended to the state file ``<outdir>/gvc<T>.state``
*before* it is created; ``teardown`` deletes only names found there that still exist and carry the prefix, and
stops only processes recorded there (by process group, checked against the recorded start time). Nothing is ever
created in the root namespace: links are made by commands executed inside our namespaces (``ip -n`` / ``tc -n``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "kibit": 1024, "mibit": 1024**2, "gibit": 1024**3}
_DELAY_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}


class ClusterError(RuntimeError):
    """Refusal or failure of an emulated-cluster operation (the message says what to do)."""


def prefix(tag: int) -> str:
    """Name prefix of everything owned by tag ``tag``."""
    return f"gvc{tag}-"


def check_tag(tag: int) -> int:
    """Tags are small integers: they become the third octet of 10.77.<T>.0/24."""
    if not isinstance(tag, int) or not 0 <= tag <= 255:
        raise ClusterError(f"tag must be an integer in 0..255, got {tag!r}")
    return tag


def check_prereqs() -> None:
    """Refuse unless running as root with ``ip``, ``tc`` and ``taskset`` available."""
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (CAP_NET_ADMIN for network namespaces); run as root")
    missing = [tool for tool in ("ip", "tc", "taskset") if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"missing tools: {', '.join(missing)} (install iproute2 / util-linux)")


def parse_rate(rate: str) -> float:
    """``"100mbit"`` -> 1e8 bits/s (tc's units: kbit/mbit/gbit are decimal)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", rate)
    unit = (m.group(2).lower() or "bit") if m else ""
    if not m or unit not in _RATE_UNITS:
        raise ClusterError(f"bad rate {rate!r}; use e.g. 100mbit or 1gbit")
    return float(m.group(1)) * _RATE_UNITS[unit]


def parse_delay(delay: str) -> float:
    """``"0.5ms"`` -> 0.0005 seconds; ``"0"`` -> 0."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", delay)
    unit = (m.group(2).lower() or "s") if m else ""
    if not m or unit not in _DELAY_UNITS:
        raise ClusterError(f"bad delay {delay!r}; use e.g. 0.5ms or 5ms")
    return float(m.group(1)) * _DELAY_UNITS[unit]


def burst_bytes(rate: str) -> int:
    """tbf bucket: a power of two >= rate/HZ for HZ down to 500 (256 KiB at 1gbit, 32 KiB at 100mbit), >= 16 KiB."""
    need = parse_rate(rate) / 8 / 500
    return max(16384, 2 ** math.ceil(math.log2(need)))


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command, capturing text output; raise ClusterError with its stderr on failure."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_netns() -> list[str]:
    """Names of all network namespaces known to ``ip netns``."""
    out = sh("ip", "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def owned_existing(tag: int) -> list[str]:
    """Existing namespaces that carry this tag's prefix."""
    return [name for name in list_netns() if name.startswith(prefix(tag))]


class StateFile:
    """Append-only record of what a tag created: ``netns <name>``, ``pid <pid> <starttime>``, ``meta <json>``."""

    def __init__(self, outdir: str | Path, tag: int):
        self.tag = check_tag(tag)
        self.path = Path(outdir) / f"gvc{tag}.state"

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _entries(self, kind: str) -> list[list[str]]:
        if not self.path.exists():
            return []
        rows = [line.split(" ", 1) for line in self.path.read_text().splitlines()]
        return [row[1].split(" ") if kind != "meta" else [row[1]] for row in rows if len(row) == 2 and row[0] == kind]

    def reset(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def record_netns(self, name: str) -> None:
        if not name.startswith(prefix(self.tag)):
            raise ClusterError(f"refusing a namespace name without our prefix: {name}")
        self._append(f"netns {name}")

    def record_pid(self, pid: int) -> None:
        self._append(f"pid {pid} {proc_starttime(pid)}")

    def record_meta(self, meta: dict) -> None:
        self._append("meta " + json.dumps(meta, sort_keys=True))

    def netns(self) -> list[str]:
        return list(dict.fromkeys(row[0] for row in self._entries("netns")))

    def pids(self) -> list[tuple[int, str]]:
        return [(int(row[0]), row[1]) for row in self._entries("pid")]

    def meta(self) -> dict | None:
        rows = self._entries("meta")
        return json.loads(rows[-1][0]) if rows else None


def proc_starttime(pid: int) -> str:
    """Start time (clock ticks since boot) of ``pid``, or "" if it is gone; guards against PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def stop_groups(entries: list[tuple[int, str]], grace: float = 10.0) -> None:
    """SIGTERM (then SIGCONT) the process groups led by recorded ``(pid, starttime)`` (started with a new session)
    all at once, then SIGKILL whatever survives ``grace`` seconds.

    A pid now owned by a different process (start time differs) is skipped. If the leader is gone, the group id
    cannot have been reused (Linux never hands out a PID still in use as a group id), so the group is still ours.
    """
    def ours(pid: int, starttime: str) -> bool:
        now = proc_starttime(pid)
        return not (now and starttime and now != starttime)

    pending = [pid for pid, start in entries if ours(pid, start) and _signal_group(pid, signal.SIGTERM)]
    for pid in pending:            # a stopped member (SIGSTOP: a hung peer) acts on SIGTERM only once continued
        _signal_group(pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending = [pid for pid in pending if _group_alive(pid)]
    for pid in pending:
        _signal_group(pid, signal.SIGKILL)


def stop_group(pid: int, starttime: str, grace: float = 10.0) -> None:
    """``stop_groups`` for one recorded process."""
    stop_groups([(pid, starttime)], grace)


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    _reap(pgid)
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _reap(pid: int) -> None:
    """Collect our own exited child so its zombie does not look alive."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def add_netns(state: StateFile, name: str) -> None:
    """Record, then create, one namespace of ours, with its loopback up."""
    state.record_netns(name)
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "set", "lo", "up")


def add_bridge(ns: str, bridge: str) -> None:
    """A plain bridge in ``ns``: no STP, ports forward at once."""
    sh("ip", "-n", ns, "link", "add", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
    sh("ip", "-n", ns, "link", "set", bridge, "up")


def plug(hub: str, bridge: str, port: str, rank_ns: str, cidr: str, rate: str, delay: str = "0") -> None:
    """veth ``port`` (in ``hub``, on ``bridge``) <-> ``eth0`` (in ``rank_ns``, address ``cidr``), MTU 1500,
    shaped at both ends: rank egress = upload, hub egress = download. Created from inside ``hub``."""
    sh("ip", "-n", hub, "link", "add", port, "mtu", "1500", "type", "veth", "peer", "name", "eth0",
       "netns", rank_ns, "mtu", "1500")
    sh("ip", "-n", hub, "link", "set", port, "master", bridge, "up")
    sh("ip", "-n", rank_ns, "addr", "add", cidr, "dev", "eth0")
    sh("ip", "-n", rank_ns, "link", "set", "eth0", "up")
    shape(rank_ns, "eth0", rate, delay)
    shape(hub, port, rate, delay)


def shape(ns: str, dev: str, rate: str, delay: str = "0") -> None:
    """Egress shaping on ``dev`` in ``ns``: tbf at ``rate``; with a delay, netem as root and the tbf as its child."""
    tbf = ["tbf", "rate", rate, "burst", str(burst_bytes(rate)), "latency", "50ms"]
    if parse_delay(delay) > 0:
        netem = sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "netem", "delay", delay,
                   check=False)
        if netem.returncode != 0:
            raise ClusterError(f"cannot add a netem delay ({netem.stderr.strip()}); this kernel probably lacks "
                               "sch_netem (CONFIG_NET_SCH_NETEM): run without --delay")
        sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
    else:
        sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *tbf)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Defer SIGINT/SIGTERM (main thread only) so a second Ctrl-C cannot cut a teardown short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def teardown(state: StateFile) -> list[str]:
    """Stop recorded processes, delete recorded namespaces that still exist and carry the prefix. Idempotent."""
    stop_groups(state.pids())
    existing = set(list_netns()) if state.path.exists() else set()
    deleted = []
    for name in state.netns():
        if name.startswith(prefix(state.tag)) and name in existing:
            sh("ip", "netns", "delete", name)
            deleted.append(name)
    if state.path.exists() and not set(state.netns()) & set(list_netns()):
        state.path.unlink()
    return deleted


def probe(outdir: str | Path, tag: int) -> str | None:
    """Try a throw-away namespace with a veth pair and a tbf qdisc; return why it fails, or None if it works."""
    try:
        check_prereqs()
        if owned_existing(tag):
            return f"namespaces with prefix {prefix(tag)} already exist"
        state = StateFile(outdir, tag)
        state.reset()
        name = prefix(tag) + "probe"
        try:
            add_netns(state, name)
            sh("ip", "-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
            shape(name, "a0", "100mbit")
        finally:
            teardown(state)
    except ClusterError as err:
        return str(err)
    return None
