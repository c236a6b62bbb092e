"""Step time at N = 2…64 ranks: a model from measured kernel costs and α–β collective laws, validated against
measured steps on the emulated cluster (docs/SCALE.md).

    python -m ds_gravac_bench.scale run --rate 100mbit --ranks 2,3,4 --tag 41 --out runs/scale
    python -m ds_gravac_bench.scale collect --rate 100mbit --run 2=runs/scale/100mbit-n2 ... \
        --probes runs/scale/probes-100mbit.json --out docs/bench/scale/input-100mbit.json
    python -m ds_gravac_bench.scale table docs/bench/scale/input-100mbit.json [--kernels input-1gbit.json] \
        [--json docs/bench/scale/table-100mbit.json] [--csv ...]
    python -m ds_gravac_bench.scale summary docs/bench/scale/input-100mbit.json docs/bench/scale/input-1gbit.json

``run`` probes the collectives at each N (``scale_probe``) and runs the end-to-end benchmark with the systems at
each N (``ds_gravac_bench.e2e``, ``--steps`` steps), writing the machine load before and after each run; ``collect``
keeps what the model needs (``scale_inputs``); ``table`` prints the table (``scale_table``) as Markdown;
``summary`` sets several rates' tables side by side (``scale_report``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

from .scale_inputs import FORMAT, collect, load_input, read_probes
from .scale_report import markdown, summary, write_csv
from .scale_table import build

SYSTEMS = ("ds_dense", "gv_qsgd8", "gv_powersgd_r16", "gv_topk_100")
RUN_SYSTEMS = ("compute_only_engine",) + SYSTEMS
GRID = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128)


def run(opts: argparse.Namespace) -> None:
    """Probes, then one e2e invocation per N, each recording the load around it."""
    from .scale_probe import loadavg, probe

    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = [int(n) for n in opts.ranks.split(",")]
    if not opts.skip_probe:
        probes = probe(ranks, opts.rate, opts.tag, out)
        (out / f"probes-{opts.rate}.json").write_text(json.dumps(probes, indent=1))
    for n in ranks:
        run_dir = out / f"{opts.rate}-n{n}"
        before = loadavg()
        cmd = [sys.executable, "-m", "ds_gravac_bench.e2e", "run", "--model", opts.model, "--rate", opts.rate,
               "--ranks", str(n), "--steps", str(opts.steps), "--tag", str(opts.tag), "--timeout", "900",
               "--systems", opts.systems, "--out", str(run_dir)]
        with open(out / f"{opts.rate}-n{n}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()).returncode
        (run_dir / "load.json").write_text(json.dumps({"before": before, "after": loadavg(), "returncode": rc}))
        print(f"[scale run] {opts.rate} N={n}: exit {rc}, load {before} -> {loadavg()}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="probe and run the e2e systems on the emulated cluster at each N")
    r.add_argument("--rate", required=True)
    r.add_argument("--ranks", default="2,3,4")
    r.add_argument("--model", default="resnet18")
    r.add_argument("--steps", type=int, default=12)
    r.add_argument("--systems", default=",".join(RUN_SYSTEMS))
    r.add_argument("--tag", type=int, default=41)
    r.add_argument("--skip-probe", action="store_true")
    r.add_argument("--out", default="runs/scale")
    c = sub.add_parser("collect", help="keep the medians, probes and workloads the model needs")
    c.add_argument("--rate", required=True)
    c.add_argument("--run", action="append", default=[], metavar="N=DIR", help="an e2e output directory at N ranks")
    c.add_argument("--compute", action="append", default=[], metavar="N=DIR",
                   help="an e2e directory holding compute_only_engine at N ranks (default: the --run of N)")
    c.add_argument("--probes", required=True, nargs="+",
                   help="a `scale probe` file, or the cluster `measure` JSON of each N")
    c.add_argument("--model", default="resnet18")
    c.add_argument("--systems", default=",".join(SYSTEMS))
    c.add_argument("--grid", default=",".join(map(str, GRID)), help="world sizes the workloads are planned at")
    c.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    c.add_argument("--out", required=True)
    t = sub.add_parser("table", help="the table of a collected input")
    t.add_argument("input")
    t.add_argument("--kernels", default=None, help="take kernel costs from another rate's input")
    t.add_argument("--compute-s", type=float, default=None,
                   help="compute seconds per step for the predicted rows (default: the reference run's estimate)")
    t.add_argument("--json", default=None)
    t.add_argument("--csv", default=None)
    m = sub.add_parser("summary", help="validation and predicted rows of several rates' tables (docs/SCALE.md)")
    m.add_argument("tables", nargs="+", help="collected inputs, or tables written by `table --json`")
    m.add_argument("--compute-s", type=float, default=None, help="as for `table`")
    opts = parser.parse_args(argv)
    if opts.cmd == "run":
        run(opts)
    elif opts.cmd == "collect":
        from .systems import resolve_system, system_matrix

        matrix = system_matrix(12)
        ids = opts.systems.split(",")
        sections = {sid: resolve_system(matrix, sid).gravac for sid in ids}
        runs, compute = ({int(k): Path(v) for k, v in (item.split("=", 1) for item in items)}
                         for items in (opts.run, opts.compute))
        inp = collect(opts.model, opts.rate, sections, runs, read_probes([Path(p) for p in opts.probes]),
                      [int(n) for n in opts.grid.split(",")], opts.cores, compute)
        Path(opts.out).write_text(json.dumps(inp, separators=(",", ":")))
        print(f"[scale collect] {opts.out}: {Path(opts.out).stat().st_size} bytes")
    elif opts.cmd == "summary":
        docs = [json.loads(Path(p).read_text()) for p in opts.tables]
        print(summary([build(d, compute_s=opts.compute_s) if d.get("format") == FORMAT else d for d in docs]))
    else:
        table = build(load_input(Path(opts.input)), load_input(Path(opts.kernels)) if opts.kernels else None,
                      compute_s=opts.compute_s)
        if opts.json:
            Path(opts.json).write_text(json.dumps(table, indent=1))
        if opts.csv:
            write_csv(table, Path(opts.csv))
        print(markdown(table))


if __name__ == "__main__":
    main()
