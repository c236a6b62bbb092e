"""Step time at N = 2…64 ranks: a model from measured kernel costs and α–β collective laws, validated against
measured steps on the emulated cluster (docs/SCALE.md).

    python -m ds_gravac_bench.scale run --rate 100mbit --ranks 2,3,4 --tag 41 --out runs/scale
    python -m ds_gravac_bench.scale collect --rate 100mbit --run 2=runs/scale/100mbit-n2 ... \
        --probes runs/scale/probes-100mbit.json --out docs/bench/scale/input-100mbit.json
    python -m ds_gravac_bench.scale table docs/bench/scale/input-100mbit.json [--kernels input-1gbit.json] \
        [--json docs/bench/scale/table-100mbit.json] [--csv ...]

``run`` probes the collectives at each N (``scale_probe``) and runs the end-to-end benchmark with the systems at
each N (``ds_gravac_bench.e2e``, ``--steps`` steps), writing the machine load before and after each run; ``collect``
keeps what the model needs (``scale_inputs``); ``table`` prints the table (``scale_table``) as Markdown.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from .scale_inputs import collect, load_input, read_probes
from .scale_table import build

SYSTEMS = ("ds_dense", "gv_default", "gv_powersgd_r16", "gv_topk_100")
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


def _fmt(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def markdown(table: dict[str, Any]) -> str:
    """The table as Markdown: measured rows with their error, predicted rows labelled."""
    lines = [f"{table['model']}, {table['rate']}, kernels from the {table['kernels_from']}; comm = α–β fits "
             "(measured N: its own probe line; other N: the law). Compute at a measured N: the compute-only step "
             "of that N (\"error, own compute\": each system's own compute estimate instead).", "",
             "| system | N | status | step measured s (p10–p90) | step predicted s | error | error, own compute | "
             "compute / codec / comm predicted s | comm wait measured s | MB/step measured / predicted | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        p, m = r["pred"], r.get("measured") or {}
        meas = f"{m['step_s']:.2f} ({m['step_p10_s']:.2f}–{m['step_p90_s']:.2f})" if "step_s" in m else "–"
        status = r["status"] + (" (oversubscribed)" if "oversubscribed" in r["compute_source"] else "")
        err, own = (f"{100 * r[k]:+.1f}%" if r.get(k) is not None else "–" for k in ("error", "error_own_compute"))
        mb = f"{_fmt(m.get('bytes_sent', 0) / 1e6 if m.get('bytes_sent') else None)} / {p['bytes'] / 1e6:.2f}"
        load = r.get("load") or {}
        lines.append(f"| {r['system']} | {r['n']} | {status} | {meas} | {p['step']:.2f} | {err} | {own} | "
                     f"{p['compute']:.2f} / {p['codec']:.2f} / {p['comm']:.2f} | {_fmt(m.get('comm_wait_s'))} | {mb} "
                     f"| {load.get('before', '–')} → {load.get('after', '–')} |".replace("– → –", "–"))
    lines += ["", f"Laws fitted on the probes at N = {', '.join(map(str, table['law_fitted_on_n']))}:", "",
              "| op | α ms | β → Mbit/s | law vs probes, worst error per N |", "|---|---|---|---|"]
    for op, law in table["laws"].items():
        worst = ", ".join(f"N={c['n']}: {100 * c['law_max_err']:+.0f}%" for c in table["law_check"] if c["op"] == op)
        lines.append(f"| {op} | {1e3 * law['alpha_s']:.3f} | {_fmt(law['mbit_s'], 1)} | {worst} |")
    lines += ["", "| all-gather system | against | first N where it is not faster (law, a core per rank) |",
              "|---|---|---|"]
    for c in table["crossover"]:
        hit = c["first_n_not_faster"]
        lines.append(f"| {c['system']} | {c['against']} | {hit if hit else '> ' + str(c['grid_max'])} |")
    return "\n".join(lines)


def write_csv(table: dict[str, Any], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["system", "n", "status", "step_measured_s", "step_predicted_s", "error", "compute_s", "codec_s",
                    "comm_s", "comm_wait_measured_s", "bytes_measured", "bytes_predicted", "compute_source"])
        for r in table["rows"]:
            p, m = r["pred"], r.get("measured") or {}
            w.writerow([r["system"], r["n"], r["status"], m.get("step_s"), round(p["step"], 4), r.get("error"),
                        round(p["compute"], 4), round(p["codec"], 4), round(p["comm"], 4), m.get("comm_wait_s"),
                        m.get("bytes_sent"), round(p["bytes"]), r["compute_source"]])


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
    t.add_argument("--json", default=None)
    t.add_argument("--csv", default=None)
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
    else:
        table = build(load_input(Path(opts.input)), load_input(Path(opts.kernels)) if opts.kernels else None)
        if opts.json:
            Path(opts.json).write_text(json.dumps(table, indent=1))
        if opts.csv:
            write_csv(table, Path(opts.csv))
        print(markdown(table))


if __name__ == "__main__":
    main()
