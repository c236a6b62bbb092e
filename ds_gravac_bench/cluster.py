"""Emulated multi-node cluster on one machine: network namespaces joined by a bridge, tbf-shaped links.

    python -m ds_gravac_bench.cluster up --ranks 2 --rate 100mbit [--delay 0.5ms] [--tag 0] [--outdir DIR]
    python -m ds_gravac_bench.cluster status | measure | down      [--tag 0] [--outdir DIR]
    python -m ds_gravac_bench.cluster run --rank 0 -- python -c "print('hello from gvc0-r0')"

Python API: ``with EmulatedCluster(ranks=2, rate="100mbit", tag=7, outdir=d) as c: c.launch_deepspeed(...)``.
Rank i lives in namespace ``gvc<T>-r<i>`` with interface ``eth0`` = 10.77.<T>.<i+1>/24, pinned to one core.
State file, hostfile and per-rank logs go to ``--outdir`` (default ``$GVC_OUTDIR`` or ``ds_gravac_cluster`` in the
system's temporary directory: ``cluster down`` finds the state of a cluster left up there).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ds_gravac_bench import netns
from ds_gravac_bench.netns import ClusterError

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DEFAULT_OUTDIR = Path(os.environ.get("GVC_OUTDIR") or Path(tempfile.gettempdir()) / "ds_gravac_cluster")
DEFAULT_SIZES = [16 * 1024 * 4**k for k in range(7)]           # 16 KiB ... 64 MiB
OPS = ("all_reduce", "all_gather", "all_to_all")


@dataclass
class RankResult:
    """Outcome of one rank's process: return code (None = killed at the timeout) and its output files."""
    rank: int
    returncode: int | None
    stdout: Path
    stderr: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def text(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


class EmulatedCluster:
    """N rank namespaces on a hub bridge, each port shaped to ``rate`` both ways; a context manager that tears down."""

    def __init__(self, ranks: int = 2, rate: str = "100mbit", delay: str = "0", tag: int = 0,
                 outdir: str | Path = DEFAULT_OUTDIR, cores: list[int] | None = None):
        self.ranks, self.rate, self.delay = ranks, rate, delay
        self.tag = netns.check_tag(tag)
        self.outdir = Path(outdir)
        self.cores = cores or sorted(os.sched_getaffinity(0))
        self.state = netns.StateFile(self.outdir, tag)
        self.hub, self.master_addr = f"{netns.prefix(tag)}hub", self.addr(0)
        self.hostfile, self.logdir = self.outdir / f"gvc{tag}.hostfile", self.outdir / f"gvc{tag}-logs"
        self._launches = 0
        self._ops_warm = False
        self._saved_handlers: dict[int, object] = {}

    # -- names --------------------------------------------------------------------------------------------------
    def ns(self, rank: int) -> str:
        return f"{netns.prefix(self.tag)}r{rank}"

    def addr(self, rank: int) -> str:
        return f"10.77.{self.tag}.{rank + 1}"

    @property
    def oversubscribed(self) -> bool:
        return self.ranks > len(self.cores)

    def core(self, rank: int) -> int:
        return self.cores[rank % len(self.cores)]

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def up(self) -> "EmulatedCluster":
        """Create the namespaces, bridge, links and qdiscs; refuses if any ``gvc<T>-`` namespace exists."""
        netns.check_prereqs()
        if self.ranks < 1 or self.ranks > 250:
            raise ClusterError(f"ranks must be in 1..250, got {self.ranks}")
        netns.parse_rate(self.rate)
        netns.parse_delay(self.delay)
        stale = netns.owned_existing(self.tag)
        if stale:
            raise ClusterError(f"namespaces {stale} already exist (stale setup?); remove them with "
                               f"`python -m ds_gravac_bench.cluster down --tag {self.tag} --outdir <its outdir>`")
        self.state.reset()
        self.state.record_meta({"ranks": self.ranks, "rate": self.rate, "delay": self.delay, "cores": self.cores})
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        netns.add_netns(self.state, self.hub)
        netns.add_bridge(self.hub, "br0")
        for i in range(self.ranks):
            netns.add_netns(self.state, self.ns(i))
            netns.plug(self.hub, "br0", f"p{i}", self.ns(i), f"{self.addr(i)}/24", self.rate, self.delay)
        self.hostfile.write_text("".join(f"node{i} slots=1\n" for i in range(self.ranks)))
        self.logdir.mkdir(parents=True, exist_ok=True)

    def down(self) -> list[str]:
        """Stop recorded processes and delete recorded namespaces (idempotent; SIGINT/SIGTERM held off meanwhile)."""
        with netns.signals_held():
            return netns.teardown(self.state)

    def __enter__(self) -> "EmulatedCluster":
        atexit.register(self.down)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved_handlers[sig] = signal.signal(sig, _raise_on_signal)
        try:
            return self.up()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            self._restore()

    def _restore(self) -> None:
        atexit.unregister(self.down)
        for sig, handler in self._saved_handlers.items():
            signal.signal(sig, handler)
        self._saved_handlers.clear()

    @classmethod
    def attach(cls, tag: int = 0, outdir: str | Path = DEFAULT_OUTDIR) -> "EmulatedCluster":
        """The cluster an earlier ``up`` (e.g. from the CLI) left running, read from its state file."""
        netns.check_prereqs()
        meta = netns.StateFile(outdir, tag).meta()
        if meta is None:
            raise ClusterError(f"no cluster state for tag {tag} in {outdir}; run `up` first")
        cluster = cls(meta["ranks"], meta["rate"], meta["delay"], tag, outdir, meta["cores"])
        missing = set(cluster.state.netns()) - set(netns.list_netns())
        if missing:
            raise ClusterError(f"namespaces {sorted(missing)} are gone; run `down` then `up` again")
        return cluster

    # -- processes ----------------------------------------------------------------------------------------------
    def rank_env(self) -> dict[str, str]:
        """Environment of every rank: one thread, CPU accelerator, gloo on eth0, wandb offline, venv first on PATH;
        the shm op JIT cache as in the Makefile."""
        ext_dir = os.environ.get("TORCH_EXTENSIONS_DIR", str(VENV_BIN.parent / "torch_extensions"))
        return {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "GLOO_SOCKET_IFNAME": "eth0",
                "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "TORCH_EXTENSIONS_DIR": ext_dir,
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}

    def wrap(self, rank: int, cmd: list[str]) -> list[str]:
        """``ip netns exec gvc<T>-r<i> taskset -c <core> env K=V ... <cmd>``."""
        env = [f"{k}={v}" for k, v in self.rank_env().items()]
        return ["ip", "netns", "exec", self.ns(rank), "taskset", "-c", str(self.core(rank)), "env", *env, *cmd]

    def spawn(self, rank: int, cmd: list[str], stdout: object = None, stderr: object = None) -> subprocess.Popen:
        """Start ``cmd`` in rank's namespace in its own session; its PID (= process group) goes to the state file."""
        if not 0 <= rank < self.ranks:
            raise ClusterError(f"rank {rank} out of range 0..{self.ranks - 1}")
        proc = subprocess.Popen(self.wrap(rank, cmd), cwd=ROOT, stdout=stdout, stderr=stderr,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.state.record_pid(proc.pid)
        return proc

    def run_all(self, cmds: list[list[str]], name: str, timeout: float = 600.0, grace: float = 10.0
                ) -> list[RankResult]:
        """Run ``cmds[i]`` on rank i, outputs to ``<logdir>/<name>-r<i>.{out,err}``; wait up to ``timeout`` s.

        When a rank fails, the others get ``grace`` seconds to finish (they usually hang on a dead peer) and are
        then stopped; at the timeout every rank still running is stopped and reported with returncode None.
        """
        self.logdir.mkdir(parents=True, exist_ok=True)
        procs, results = [], []
        for rank, cmd in enumerate(cmds):
            out, err = self.logdir / f"{name}-r{rank}.out", self.logdir / f"{name}-r{rank}.err"
            with open(out, "wb") as fo, open(err, "wb") as fe:
                procs.append(self.spawn(rank, cmd, fo, fe))
            results.append(RankResult(rank, None, out, err))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + grace)
            time.sleep(0.2)
        running = [p for p in procs if p.poll() is None]
        netns.stop_groups([(p.pid, netns.proc_starttime(p.pid)) for p in running])
        for proc, result in zip(procs, results):
            if proc in running:
                proc.wait()
            else:
                result.returncode = proc.returncode
        return results

    def _launch(self, kind: str, per_rank: list[list[str]], port: int, tail: list[str], timeout: float,
                grace: float = 10.0) -> list[RankResult]:
        """Run ``<venv>/bin/<kind> <per_rank[i]> --master_addr 10.77.<T>.1 --master_port <port> <tail>`` on rank i."""
        self._launches += 1
        if not self._ops_warm:     # a cold JIT compile on one pinned core per rank takes minutes (warm_ops.py)
            subprocess.run([str(VENV_BIN / "python"), "-m", "runners.warm_ops"], cwd=ROOT, check=True,
                           env={**os.environ, **self.rank_env()}, stdout=subprocess.DEVNULL, timeout=900)
            self._ops_warm = True
        cmds = [[str(VENV_BIN / kind), *own, "--master_addr", self.master_addr, "--master_port", str(port), *tail]
                for own in per_rank]
        return self.run_all(cmds, f"{kind}{self._launches}-{os.getpid()}", timeout, grace)

    def launch_deepspeed(self, script: str, args: list[str] = (), port: int = 29500, timeout: float = 600.0,
                         grace: float = 10.0) -> list[RankResult]:
        """``deepspeed --hostfile H --no_ssh --node_rank i --master_addr 10.77.<T>.1 ...`` in every namespace;
        ``grace``: seconds the other ranks get once one failed (then they are stopped)."""
        per_rank = [["--hostfile", str(self.hostfile), "--no_ssh", "--node_rank", str(i)] for i in range(self.ranks)]
        return self._launch("deepspeed", per_rank, port, [script, *args], timeout, grace)

    def launch_torchrun(self, script: str, args: list[str] = (), port: int = 29500, timeout: float = 600.0
                        ) -> list[RankResult]:
        """``torchrun --nnodes N --node_rank i --nproc_per_node 1 --master_addr ...`` in every namespace."""
        per_rank = [["--nnodes", str(self.ranks), "--node_rank", str(i), "--nproc_per_node", "1"]
                    for i in range(self.ranks)]
        return self._launch("torchrun", per_rank, port, [script, *args], timeout)

    def tx_bytes(self, rank: int) -> int:
        """Bytes rank's ``eth0`` has transmitted (ground truth incl. TCP/IP overhead), read inside its namespace."""
        out = netns.sh("ip", "netns", "exec", self.ns(rank), "cat", "/sys/class/net/eth0/statistics/tx_bytes")
        return int(out.stdout.strip())

    def measure(self, sizes: list[int] = DEFAULT_SIZES, ops: tuple[str, ...] = OPS, port: int = 29600,
                max_repeats: int = 8, timeout: float = 900.0) -> dict:
        """Time gloo collectives between all ranks; per-size Mbit/s and ``t = A + B·bytes`` fits per op."""
        spec = {"world": self.ranks, "master": self.master_addr, "port": port, "sizes": list(sizes), "ops": list(ops),
                "max_repeats": max_repeats, "burst": netns.burst_bytes(self.rate)}
        self._launches += 1
        results = self.run_all([[str(VENV_BIN / "python"), "-m", "ds_gravac_bench.link_probe",
                                 json.dumps({**spec, "rank": i})] for i in range(self.ranks)],
                               f"measure{self._launches}-{os.getpid()}", timeout)
        failed = [r for r in results if not r.ok]
        if failed:
            raise ClusterError(f"measure failed on rank {failed[0].rank}: {failed[0].text()[-2000:]}")
        report = json.loads(results[0].stdout.read_text().strip().splitlines()[-1])
        report.update(ranks=self.ranks, rate=self.rate, delay=self.delay, rate_mbit=netns.parse_rate(self.rate) / 1e6,
                      burst_bytes=spec["burst"],
                      oversubscribed=self.oversubscribed)
        return report

    def status(self) -> dict:
        """Configuration, existing namespaces, eth0 qdiscs and tx_bytes per rank."""
        alive = set(netns.list_netns())
        ranks = [{"rank": i, "netns": self.ns(i), "addr": self.addr(i), "core": self.core(i),
                  "qdisc": netns.sh("tc", "-n", self.ns(i), "qdisc", "show", "dev", "eth0").stdout.strip(),
                  "tx_bytes": self.tx_bytes(i)} for i in range(self.ranks) if self.ns(i) in alive]
        return {"tag": self.tag, "ranks": self.ranks, "rate": self.rate, "delay": self.delay,
                "oversubscribed": self.oversubscribed, "hostfile": str(self.hostfile),
                "state_file": str(self.state.path), "hub_up": self.hub in alive, "rank_info": ranks}


def _raise_on_signal(signum: int, frame: object) -> None:
    """SIGINT/SIGTERM unwind the stack so ``__exit__`` tears the cluster down."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


# -- CLI ----------------------------------------------------------------------------------------------------------
def parse_sizes(text: str) -> list[int]:
    """``"16KiB,1MiB,4096"`` -> bytes."""
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "b": 1, "": 1}
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        num = item.rstrip("KMGiBkmgb")
        out.append(int(float(num) * units[item[len(num):].lower()]))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmds = {name: sub.add_parser(name) for name in ("up", "status", "down", "run", "measure")}
    for p in cmds.values():
        p.add_argument("--tag", type=int, default=0)
        p.add_argument("--outdir", default=str(DEFAULT_OUTDIR))
    cmds["up"].add_argument("--ranks", type=int, required=True)
    cmds["up"].add_argument("--rate", required=True, help="tbf rate per port and direction, e.g. 100mbit, 1gbit")
    cmds["up"].add_argument("--delay", default="0", help="netem delay on both ends of every link: rank-to-rank "
                            "one-way latency is 2x this (needs sch_netem)")
    cmds["run"].add_argument("--rank", type=int, required=True)
    cmds["run"].add_argument("cmd", nargs=argparse.REMAINDER, help="-- command ...")
    cmds["measure"].add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="e.g. 16KiB,1MiB,64MiB")
    cmds["measure"].add_argument("--ops", default=",".join(OPS))
    cmds["measure"].add_argument("--port", type=int, default=29600)
    cmds["measure"].add_argument("--max-repeats", type=int, default=8)
    return parser


def cli_run(cluster: EmulatedCluster, rank: int, cmd: list[str]) -> int:
    """Run one command in a rank's namespace in the foreground; Ctrl-C/SIGTERM stop it by its recorded PID."""
    cmd = cmd[1:] if cmd[:1] == ["--"] else cmd
    if not cmd:
        raise ClusterError("nothing to run: use `run --rank i -- <cmd>`")
    for sig in (signal.SIGINT, signal.SIGTERM):         # also when started with SIGINT ignored (background job)
        signal.signal(sig, _raise_on_signal)
    proc = cluster.spawn(rank, cmd)
    try:
        return proc.wait()
    except (KeyboardInterrupt, SystemExit):
        netns.stop_group(proc.pid, netns.proc_starttime(proc.pid))
        proc.wait()
        return 130


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            cluster = EmulatedCluster(args.ranks, args.rate, args.delay, args.tag, args.outdir).up()
            print(json.dumps(cluster.status(), indent=2))
        elif args.command == "down":
            netns.check_prereqs()
            deleted = netns.teardown(netns.StateFile(args.outdir, args.tag))
            left = netns.owned_existing(args.tag)
            print(f"deleted {deleted}" + (f"; NOT ours per {args.outdir}, left alone: {left}" if left else ""))
        elif args.command == "status":
            print(json.dumps(EmulatedCluster.attach(args.tag, args.outdir).status(), indent=2))
        elif args.command == "run":
            return cli_run(EmulatedCluster.attach(args.tag, args.outdir), args.rank, args.cmd)
        elif args.command == "measure":
            cluster = EmulatedCluster.attach(args.tag, args.outdir)
            report = cluster.measure(parse_sizes(args.sizes), tuple(args.ops.split(",")), args.port,
                                     args.max_repeats)
            (cluster.outdir / f"gvc{cluster.tag}-measure.json").write_text(json.dumps(report, indent=2))
            print(json.dumps(report, indent=2))
    except ClusterError as err:
        print(f"emulated_cluster: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
