"""End-to-end comparison on the emulated cluster: DeepSpeed dense, ds_gravac dense, PyTorch DDP
(+ PowerSGD hook), static Top-k/DGC, Accordion and GraVAC — same model, data, seed and network, one invocation.

    python -m ds_gravac_bench.e2e run --model resnet101 --rate 1gbit --ranks 2 --steps 30
    python -m ds_gravac_bench.e2e report runs/<dir>
    python -m ds_gravac_bench.e2e run --smoke        # no namespaces: 127.0.0.1, tiny model, 3 steps, 2 systems
    python -m ds_gravac_bench.e2e run --ablation topk:100 --rate 1gbit  # dense → no overlap/bulk → +overlap → +bulk

Needs root for the namespaces (ds_gravac_bench/cluster.py). Writes ``<out>/meta.json`` (default ``--out``:
``runs/e2e-<date>-<model>-<rate>``, git-ignored), per-system
``systems/<id>/steps.jsonl`` and logs, then ``results.json``, ``results.md`` and ``plots/`` (report.py).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import psutil

from ds_gravac.integration.ports import free_port
from ds_gravac.integration.shm_buffer import buffer_path
from ds_gravac_bench.report import report
from ds_gravac_bench.resume import checkpoint_args, last_logged_step, plan_system, prune
from ds_gravac_bench.systems import (QUICK_SYSTEMS, SMOKE_SYSTEMS, SystemSpec, ablation_ladder, resolve_system,
                                     system_config, system_matrix)

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
SCRIPTS = {"lstm": "runners/train_ptb.py"}
BASE_CONFIGS = {"resnet101": "resnet101_dense.json", "resnet18": "resnet101_dense.json",
                "vgg16": "vgg16_dense.json", "lstm": "lstm_dense.json", "tiny_cnn": "resnet101_dense.json",
                "mlp": "mlp_dense.json"}


# Caps on the instruction sets oneDNN, MKL and ATen use. They pick the kernels and so the loss curve: an AVX-512 AMD
# EPYC capped to AVX2 by all three trains as an AVX2 AMD EPYC does, bit for bit (docs/BENCHMARKS_LONG.md, "Cost").
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")


def env_block() -> dict[str, Any]:
    """Where a run was made: versions, CPU, threads, any instruction-set caps, commit and date."""
    import deepspeed
    import torch
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    caps = {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}
    preload = [Path(p).name for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()]
    if preload:                         # e.g. the shim that gives MKL its Intel kernels on AMD (mkl_vendor.py)
        caps["LD_PRELOAD"] = " ".join(preload)
    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "python": platform.python_version(),
            "cpu": cpu, "cores": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS", "1"),
            **({"isa_caps": caps} if caps else {}),
            "git_commit": commit, "date": dt.datetime.now(dt.timezone.utc).isoformat()}


def runner_args(spec: SystemSpec, model: str, steps: int, cfg_path: Path, log_dir: Path,
                micro_batch: Optional[int]) -> list[str]:
    args = ["--system", spec.system, "--deepspeed_config", str(cfg_path), "--steps", str(steps), "--seed", "0",
            "--log-dir", str(log_dir), "--run-name", spec.id, "--no-progress", "--eval-every", "0"]
    if model != "lstm":
        args += ["--model", model]
    if micro_batch:
        args += ["--micro-batch", str(micro_batch)]
    return args + list(spec.runner_args)


def _runner_env(**extra: str) -> dict[str, str]:
    """The environment every runner process on this machine gets (one thread, CPU accelerator, wandb offline)."""
    return dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline", **extra)


def run_local(script: str, args: list[str], ddp: bool, port: int, timeout: float, log: Path) -> int:
    """Smoke and loopback modes: both ranks on this machine (127.0.0.1), no namespaces. A run that outlasts
    ``timeout`` is stopped with its ranks and returns -1, so the invocation goes on to its next system."""
    env = _runner_env()
    launcher = ([str(VENV_BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port)] if ddp else
        [str(VENV_BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(port)])
    try:
        with open(log, "w") as fh:
            proc = subprocess.Popen(launcher + [script] + args, cwd=ROOT, env=env, stdout=fh,
                                    stderr=subprocess.STDOUT)
            try:
                return proc.wait(timeout=timeout)
            except BaseException as stopped:    # the timeout, or Ctrl-C / an exception sent to this process alone
                if proc.poll() is None:         # not reaped yet, so its pid is still ours to signal
                    stop_tree(proc.pid)
                proc.wait()
                if not isinstance(stopped, subprocess.TimeoutExpired):
                    raise
                fh.write(f"\n[bench_e2e] timed out after {timeout:g} s: every process stopped\n")
                return -1                       # as the cluster reports a rank stopped at its timeout
    finally:   # a run without ds_gravac (DeepSpeed's own path) never unlinks its buffers
        remove_shm_buffers([(port, r) for r in range(2)])


def stop_tree(pid: int, grace: float = 10.0) -> None:
    """SIGTERM a launcher and every process under it, then SIGKILL whatever survives ``grace`` seconds. The ranks
    stay in the invoking process group, so a signal to that group (a terminal's Ctrl-C, a stop, a kill) still reaches
    them; killing the launcher alone would leave them training, orphaned. The tree is read before any signal, while
    the ranks are still the launcher's children."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)


def _unwind_on_sigterm() -> Optional[Callable[[], None]]:
    """On loopback, SIGTERM (``kill``, ``pkill``) raises SystemExit as the cluster's handler does, so the system
    running stops its ranks on the way out (:func:`run_local`) instead of leaving them training; returns what
    restores the previous handler (None off the main thread, where no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def unwind(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    return lambda: signal.signal(signal.SIGTERM, previous)


def remove_shm_buffers(port_ranks: list[tuple[int, int]]) -> None:
    """DeepSpeed's CPU comm op leaves a ~69 MB /dev/shm buffer per process and rendezvous port; a loopback run's are
    ours to remove once its processes have exited."""
    for port, rank in port_ranks:
        buffer_path("127.0.0.1", port, rank).unlink(missing_ok=True)


def ablation_matrix(value: str) -> dict[str, SystemSpec]:
    """``--ablation topk:100`` → the ladder for that compressor and CF (sparsifiers with a fixed CF only)."""
    name, _, cf = value.partition(":")
    if name not in ("topk", "randomk", "dgc", "redsync", "sidco", "threshold") or not cf:
        raise SystemExit(f"bench_e2e: --ablation {value!r}: expected <compressor>:<cf> with compressor one of "
                         "topk, randomk, dgc, redsync, sidco, threshold (e.g. topk:100)")
    try:
        factor = float(cf)
    except ValueError:
        factor = 0.0
    if factor < 1:
        raise SystemExit(f"bench_e2e: --ablation {value!r}: cf must be a number >= 1")
    return ablation_ladder(name, factor)


def run_compute_only(script: str, args: list[str], ports: list[int], timeout: float, log_dir: Path) -> int:
    """One single-rank process per port at the same time, each pinned to its own core as in the cluster, nothing
    communicated: the median step of process 0 is T_compute (same model, batch and per-core memory contention
    as the distributed runs). Processes other than 0 log under ``log_dir/rank<i>`` without wandb."""
    cores = sorted(os.sched_getaffinity(0))
    procs = []
    for r, port in enumerate(ports):
        env = _runner_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        extra = [] if r == 0 else ["--log-dir", str(log_dir / f"rank{r}"), "--no-wandb"]
        cmd = ["taskset", "-c", str(cores[r % len(cores)]), sys.executable, script, *args, *extra]
        fh = open(log_dir / f"log{'' if r == 0 else r}.txt", "w")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT), fh))
    deadline, codes = time.monotonic() + timeout, []
    try:
        for proc, _ in procs:
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                stop_tree(proc.pid)
                proc.wait()
                codes.append(-1)
    except BaseException:        # Ctrl-C, or SIGTERM's SystemExit: none of them goes on computing
        for proc, _ in procs:
            if proc.poll() is None:      # a reaped process's pid may be another process's by now
                stop_tree(proc.pid)
            proc.wait()
        raise
    finally:
        for _, fh in procs:
            fh.close()
        remove_shm_buffers([(port, 0) for port in ports])     # each process is rank 0 of its own port
    return max(codes)


def check_sections(matrix: dict[str, SystemSpec], ids: list[str]) -> None:
    """Validate every selected "gravac" section before any cluster comes up (e.g. a bad --epsilon/--theta-min)."""
    from ds_gravac.config import parse_config
    from ds_gravac.errors import GravacConfigError

    for sid in ids:
        if matrix[sid].gravac is not None:
            try:
                parse_config(matrix[sid].gravac)
            except (GravacConfigError, ValueError) as err:
                raise SystemExit(f"bench_e2e: system {sid} (--epsilon/--theta-min/--ablation or an @key=value "
                                 f"variant): {err}") from None


def run_matrix(opts: argparse.Namespace, after_system: Optional[Callable[[Path, str], None]] = None) -> Path:
    """Every system of ``opts`` in turn into ``opts.out``; ``after_system(out, id)`` runs after each one that
    finished (exit 0), once ``meta.json`` records it (``long_keep`` keeps a long run's result there)."""
    matrix = ablation_matrix(opts.ablation) if opts.ablation else system_matrix(opts.steps, epsilon=opts.epsilon,
                                                                                 theta_min=opts.theta_min)
    ids = list(SMOKE_SYSTEMS if opts.smoke else (opts.systems.split(",") if opts.systems else matrix))
    base = json.loads((ROOT / "ds_configs" / BASE_CONFIGS[opts.model]).read_text())
    try:
        resolved = {sid: resolve_system(matrix, sid, base) for sid in ids}
    except ValueError as err:
        raise SystemExit(f"bench_e2e: --systems: {err}") from None
    ids = [resolved[sid].id for sid in ids]
    matrix = {spec.id: spec for spec in resolved.values()}
    check_sections(matrix, ids)
    loopback = opts.smoke or opts.rate == "loopback"
    net = "local" if opts.smoke else opts.rate
    out = Path(opts.out or ROOT / "runs" / f"e2e-{dt.date.today()}-{opts.model}-{net}")
    (out / "configs").mkdir(parents=True, exist_ok=True)
    if opts.lr is not None:   # otherwise the model's dense config sets it (ds_configs/README.md explains each)
        base["optimizer"]["params"]["lr"] = opts.lr
    script = SCRIPTS.get(opts.model, "runners/train_cifar.py")
    meta: dict[str, Any] = {"env": env_block(), "model": opts.model, "N": opts.ranks, "steps": opts.steps,
                            "runner_extra": list(opts.runner_extra),
                            "ablation": opts.ablation, "epsilon": opts.epsilon, "theta_min": opts.theta_min,
                            "lr": base["optimizer"]["params"]["lr"], "micro_batch": opts.micro_batch,
                            "fidelity": getattr(opts, "fidelity", None),
                            "network": {"rate": net, "delay": "0"}, "systems": {}}
    every = int(getattr(opts, "checkpoint_every", 0) or 0)
    earlier = _earlier_systems(out)
    # a directory keeps the systems earlier invocations ran and this one does not name (a step-time table run in
    # two invocations, a continued long run); only --checkpoint-every resumes or skips the ones it names
    meta["systems"].update({sid: m for sid, m in earlier.items() if sid not in ids})
    cluster = None
    if not loopback:
        from ds_gravac_bench.cluster import EmulatedCluster
        cluster = EmulatedCluster(ranks=opts.ranks, rate=opts.rate, tag=opts.tag, outdir=out / "cluster")
        cluster.__enter__()
    restore_term = None if cluster is not None else _unwind_on_sigterm()
    try:
        if cluster is not None:
            measured = cluster.measure(sizes=[1 << 20, 4 << 20, 16 << 20], ops=("all_reduce",), max_repeats=3)
            meta["network"].update(measured_mbit=measured["ops"]["all_reduce"]["fit"]["mbit_s"], fits=measured["ops"])
        for n, sid in enumerate(ids):
            spec = matrix[sid]
            cfg_path = out / "configs" / f"{sid}.json"
            cfg = system_config(base, spec)
            cfg_path.write_text(json.dumps(cfg, indent=1))
            log_dir = out / "systems" / sid
            log_dir.mkdir(parents=True, exist_ok=True)
            args = (runner_args(spec, opts.model, opts.steps, cfg_path, log_dir, opts.micro_batch)
                + list(opts.runner_extra))
            ddp = spec.system.startswith("ddp")
            if every:
                action, extra = plan_system(log_dir, opts.steps, opts.ranks, earlier.get(sid))
                if action == "done":
                    meta["systems"][sid] = earlier[sid]
                    print(f"[bench_e2e] {n + 1}/{len(ids)} {sid}: finished by an earlier invocation", flush=True)
                    continue
                args += checkpoint_args(log_dir, every) + extra
                if extra:
                    print(f"[bench_e2e] {sid}: resuming after step {last_logged_step(log_dir)}", flush=True)
            print(f"[bench_e2e] {n + 1}/{len(ids)} {sid} ...", flush=True)
            spent = _Spent()
            if spec.system in ("local", "local_engine"):
                ports = [free_port() for _ in range(opts.ranks)]    # each process is rank 0 of its own port
                rc, veth = run_compute_only(script, args, ports, opts.timeout, log_dir), 0
            else:
                ports = [29500 + n] if cluster is not None else [free_port()]
                rc, veth = _run_one(cluster, script, args, ddp, ports[0], opts.timeout, log_dir)
            before = earlier.get(sid, {}) if every else {}   # a continued run: its bytes and cost add up
            if veth and before.get("veth_bytes"):
                veth += before["veth_bytes"]
            meta["systems"][sid] = {"returncode": rc, "veth_bytes": veth, "note": spec.note, "family": spec.family,
                                    "config_hash": hashlib.sha1(cfg_path.read_bytes()).hexdigest()[:12],
                                    **({"dense_start": spec.dense_start} if spec.dense_start else {}),
                                    "ports": ports, **spent.total(before)}
            (out / "meta.json").write_text(json.dumps(meta, indent=1))
            if every and rc == 0:
                prune(log_dir, opts.ranks)
            if after_system is not None and rc == 0:
                after_system(out, sid)
            print(f"[bench_e2e] {sid}: exit {rc}", flush=True)
    finally:
        if cluster is not None:
            cluster.__exit__(None, None, None)
        if restore_term is not None:
            restore_term()
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return out


class _Spent:
    """What one system's invocation cost the machine: wall seconds, and CPU seconds of every process it started
    (all ranks; a child's CPU time counts once it has been waited for). ``total`` adds an earlier invocation's, so
    a run continued over sessions reports its whole cost; an invocation killed by a signal records nothing."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.monotonic(), self._children_cpu()

    @staticmethod
    def _children_cpu() -> float:
        use = resource.getrusage(resource.RUSAGE_CHILDREN)
        return use.ru_utime + use.ru_stime

    def total(self, earlier: dict[str, Any]) -> dict[str, float]:
        return {"wall_s": round(time.monotonic() - self.wall + earlier.get("wall_s", 0.0), 1),
                "cpu_s": round(self._children_cpu() - self.cpu + earlier.get("cpu_s", 0.0), 1)}


def _earlier_systems(out: Path) -> dict[str, Any]:
    """Systems an earlier invocation into the same directory recorded (a continued long run keeps them)."""
    path = out / "meta.json"
    return json.loads(path.read_text()).get("systems", {}) if path.is_file() else {}


def _run_one(cluster: Any, script: str, args: list[str], ddp: bool, port: int, timeout: float,
             log_dir: Path) -> tuple[Optional[int], Optional[int]]:
    if cluster is None:
        return run_local(script, args, ddp, port, timeout, log_dir / "log.txt"), None
    before = cluster.tx_bytes(0)
    launch = cluster.launch_torchrun if ddp else cluster.launch_deepspeed
    results = launch(script, args, port=port, timeout=timeout)
    with open(log_dir / "log.txt", "w") as fh:
        for r in results:
            fh.write(f"===== rank {r.rank} (exit {r.returncode}) =====\n{r.text()[-20000:]}\n")
    rc = max((r.returncode if r.returncode is not None else -1) for r in results)
    return rc, cluster.tx_bytes(0) - before


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the matrix and write the report")
    run.add_argument("--model", default="resnet101", choices=sorted(BASE_CONFIGS))
    run.add_argument("--rate", default="1gbit",
                     help="tc rate of the emulated links (1gbit, 100mbit, ...), or loopback: both ranks on this "
                          "machine over 127.0.0.1, no namespaces (loss per step only: step times are not the "
                          "cluster's)")
    run.add_argument("--ranks", type=int, default=2)
    run.add_argument("--steps", type=int, default=30)
    run.add_argument("--systems", default=None,
                     help=f"comma list (default: all); quick set: {','.join(QUICK_SYSTEMS)}; a variant overrides "
                     "keys of a system's gravac section: gv_gravac@epsilon=0.1@compressor.params.rank=8; "
                     "cfg:<file> runs a config file's gravac section (its other keys must equal the base config's; @key=value works there too)")
    run.add_argument("--micro-batch", type=int, default=None)
    run.add_argument("--runner-extra", default="", type=str.split, metavar="'OPTIONS'",
                     help="runner options added for every system, e.g. '--lstm-size medium'")
    run.add_argument("--lr", type=float, default=None,
                     help="optimizer lr (default: the model's dense config in ds_configs/)")
    run.add_argument("--epsilon", type=float, default=0.7, help="GraVAC's ε for the gv_gravac* systems")
    run.add_argument("--theta-min", type=float, default=10.0,
                     help="GraVAC's θ_min (smallest compression factor) for the gv_gravac* systems; >= 1, < 1000")
    run.add_argument("--ablation", default=None, metavar="COMPRESSOR:CF",
                     help="run the ablation ladder instead of the matrix: ds_dense, gv_dense, then the compressor "
                          "without overlap/bulk, +overlap, +bulk (e.g. topk:100)")
    run.add_argument("--tag", type=int, default=3)
    run.add_argument("--timeout", type=float, default=3600.0, help="seconds per system")
    run.add_argument("--out", default=None, help="default: runs/e2e-<date>-<model>-<rate> (git-ignored)")
    run.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                     help="checkpoint every K steps; the same command again skips finished systems and resumes the "
                          "others from their newest checkpoint (ds_gravac_bench/resume.py; on the cluster too)")
    run.add_argument("--smoke", action="store_true", help="127.0.0.1, tiny model, 3 steps, 2 systems")
    rep = sub.add_parser("report", help="rebuild results.md and plots from a results directory")
    rep.add_argument("dir")
    opts = parser.parse_args(argv)
    if opts.cmd == "report":
        out = Path(opts.dir)
    else:
        if opts.smoke:
            opts.model, opts.steps, opts.ranks = "tiny_cnn", 3, 2
        out = run_matrix(opts)
    results = report(out)
    print((out / "results.md").read_text())
    print(f"[bench_e2e] results in {out} ({len(results['systems'])} systems)")


if __name__ == "__main__":
    main()
