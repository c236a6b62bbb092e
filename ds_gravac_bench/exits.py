"""How often a user's script exits 0: the README's quick start, unchanged, run many times.

    python -m ds_gravac_bench.exits --runs 30                               # loopback, the README's command line
    python -m ds_gravac_bench.exits --runs 0 --cluster 100mbit --cluster-runs 10   # 2 nodes, emulated (root)
    python -m ds_gravac_bench.exits --script runner --runs 10 --cluster 100mbit --cluster-runs 20   # a runner

Why: a script whose gloo threads release a finished work while the interpreter is finalizing aborts ("terminate
called without an active exception", return code -6) after training correctly; ds_gravac's exit hook
(``ds_gravac/integration/teardown.py``) is meant to close that window. ``--script runner`` runs a runner instead
(``runners/train_cifar.py``, a tiny CNN for a few steps with the default section: the runners end with their own
teardown and a normal interpreter exit). Prints the count of runs whose every process exited 0, and the other
return codes seen. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

from ds_gravac_bench.e2e import free_port

ROOT = Path(__file__).resolve().parents[1]


def readme_quick_start(readme: Path = ROOT / "README.md") -> tuple[str, list[str]]:
    """The quick start's Python block and the words of its single ``deepspeed`` command line."""
    section = readme.read_text(encoding="utf-8").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    script = re.search(r"```python\n(.*?)```", section, re.S)
    shell = re.search(r"```bash\n(.*?)```", section, re.S)
    if not (script and shell):
        raise ValueError("the quick start needs a ```python block and a ```bash block")
    lines = [line for line in shell.group(1).splitlines() if " deepspeed " in f" {line} "]
    if len(lines) != 1:
        raise ValueError(f"the quick start's bash block needs one deepspeed line: {shell.group(1)!r}")
    return script.group(1), shlex.split(lines[0])


RUNNER = ["runners/train_cifar.py", "--model", "tiny_cnn", "--micro-batch", "8", "--steps", "4", "--eval-every", "-1",
          "--no-wandb", "--no-progress", "--deepspeed_config", "ds_configs/default.json"]


def script_and_args(which: str, workdir: Path) -> tuple[str, list[str], list[str]]:
    """(script path, its arguments, the loopback launcher words before the script) of the quick start or the
    runner; the runner logs under ``workdir``."""
    if which == "runner":
        return str(ROOT / RUNNER[0]), [*RUNNER[1:], "--log-dir", str(workdir / "runner_log")], ["deepspeed",
                                                                                               "--num_gpus", "2"]
    script, words = readme_quick_start()
    (workdir / "train.py").write_text(script)
    at = words.index("train.py")
    return str(workdir / "train.py"), words[at + 1:], words[:at]


def loopback(runs: int, workdir: Path, which: str = "quick_start") -> collections.Counter:
    """The quick start as written (or the runner), ``runs`` times on this machine: a counter of return codes."""
    script, args, words = script_and_args(which, workdir)
    env = dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    codes: collections.Counter = collections.Counter()
    for _ in range(runs):
        cmd = [words[0], "--master_port", str(free_port()), *words[1:], script, *args]
        codes[subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600).returncode] += 1
    return codes


def cluster(runs: int, rate: str, workdir: Path, tag: int, which: str = "quick_start") -> collections.Counter:
    """The quick start's script (or the runner) on two emulated nodes at ``rate``: a counter of each run's worst
    return code."""
    from ds_gravac_bench.cluster import EmulatedCluster

    script, args, _ = script_and_args(which, workdir)
    args = [str(ROOT / a) if a.endswith(".json") else a for a in args]      # the nodes' working directory differs
    codes: collections.Counter = collections.Counter()
    with EmulatedCluster(ranks=2, rate=rate, tag=tag, outdir=workdir / "cluster") as c:
        for i in range(runs):
            results = c.launch_deepspeed(script, args, port=29700 + i)
            bad = [r.returncode for r in results if r.returncode != 0]
            codes[bad[0] if bad else 0] += 1
            if bad:
                keep_failed(results, f"{which}-{rate}-run{i}")
    return codes


def keep_failed(results: list, name: str) -> None:
    """A failed run's rank outputs, kept under runs/exits/failed/ (the run's own directory is temporary)."""
    out = ROOT / "runs" / "exits" / "failed" / name
    out.mkdir(parents=True, exist_ok=True)
    for r in results:
        (out / f"rank{r.rank}-rc{r.returncode}.txt").write_text(r.text()[-20000:])
    print(f"run {name}: return codes {[r.returncode for r in results]}; outputs kept in {out}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="loopback runs of the README's quick start")
    ap.add_argument("--cluster", default=None, help="a rate for the emulated 2-node runs, e.g. 100mbit (root)")
    ap.add_argument("--cluster-runs", type=int, default=10)
    ap.add_argument("--tag", type=int, default=5, help="the emulated cluster's tag (its namespaces' names)")
    ap.add_argument("--script", choices=("quick_start", "runner"), default="quick_start",
                    help="the README's quick start (default) or a runner (runners/train_cifar.py, tiny CNN)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gv_exits_") as tmp:
        if args.runs:
            codes = loopback(args.runs, Path(tmp), args.script)
            print(f"{args.script}, loopback: {codes.get(0, 0)}/{args.runs} runs exited 0; return codes {dict(codes)}", flush=True)
        if args.cluster:
            codes = cluster(args.cluster_runs, args.cluster, Path(tmp), args.tag, args.script)
            print(f"{args.script}, cluster {args.cluster}, 2 nodes: {codes.get(0, 0)}/{args.cluster_runs} runs exited 0 on every "
                  f"node; return codes {dict(codes)}", flush=True)


if __name__ == "__main__":
    main()
