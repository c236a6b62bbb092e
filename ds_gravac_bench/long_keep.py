"""What the repository keeps of a long run, so that a table can be continued on another machine.

    python -m ds_gravac_bench.long_keep run --keep docs/bench/long/resnet18_long-s0 <fidelity run options>
    python -m ds_gravac_bench.long_keep save runs/long/r18-s0 docs/bench/long/resnet18_long-s0 \\
        [--cluster 100mbit=runs/long/r18-s0-100mbit]
    python -m ds_gravac_bench.long_keep restore docs/bench/long/resnet18_long-s0 runs/long/r18-s0
    python -m ds_gravac_bench.long_keep drop docs/bench/long/lstm_long-s0 "gv_auto at 1gbit"
    python -m ds_gravac_bench.long_keep rejudge docs/bench/long/resnet18_long-s0 [more kept directories]
    python -m ds_gravac_bench.long_keep price docs/bench/long/resnet18_long-s0-intel \\
        --like docs/bench/long/resnet18_long-s1
    python -m ds_gravac_bench.long_keep match docs/bench/long/resnet18_long-s0-intel runs/check [--row ID]

Why: one seed of ``resnet18_long`` is about 10 machine-hours, a working session gives about 2.5, and raw runs
live under ``runs/`` (ignored), which a new machine does not have. ``save`` writes two small files into the kept
directory after every finished run:

- ``fidelity.json``: the seed's report (every finished system's row: final loss and gap, held-out metrics, bytes,
  steps to each target, the counts that price quiet steps), merged with the rows an earlier save kept — a run
  directory's own rows win, keeping the cluster times the earlier row of the same run had. ``fidelity_seeds``
  reads such a directory as one seed and times its rows with the cluster runs it is given, as it does any kept
  report.
- ``reference.json``: the dense reference run itself — its settings (the ``meta.json`` of the invocation that
  trained it: a later save of the same curve keeps them), its config and its curve:
  every step's loss bit for bit (float32, as the runners log it, else float64), bytes per step and every
  evaluation. Per-step times are not kept, only their median: loopback times price nothing here.

``run`` is ``fidelity run`` with a ``save`` after every system that finishes (a long invocation outlasts the
session that started it, so its end may never come); with ``--rate`` it saves the controllers' rows against the
seed's loopback directory given by ``--against``. Into a directory that does not exist yet (another machine) it
restores the kept dense run first, so the same command continues the seed.

``restore`` writes that reference run back as a finished system of a new run directory, so that
``fidelity run --checkpoint-every K --out DIR`` skips it and trains only the systems still missing, and their rows
are computed against the very same dense curve; ``save`` into the same kept directory then adds them.

``drop`` removes rows from a kept report by id: a row that a later run supersedes under another id (an ablation
re-run with its settings spelled out) would otherwise stay in the seed's table, and ``save`` only ever adds.

``rejudge`` applies the current accuracy bounds to the rows a kept report holds, from the figures it keeps (its raw
runs may be gone): a bound changed after the rows were saved would otherwise judge each seed by another rule.

``match`` says whether this machine can continue a kept seed: the dense run in a run directory (a minute of
``fidelity run --task T --seed S --systems ds_dense --timeout 60 --out DIR`` is enough) against the kept curve, bit
for bit. Loss curves follow the kernels (their instruction set, and MKL's vendor check), so a machine that leaves
the kept curve at any step trains every other system of that seed on another curve too (docs/BENCHMARKS_LONG.md,
"Cost"). ``restore`` marks the run it writes, and training into such a directory makes this check first
(:mod:`ds_gravac_bench.machine_check`). ``match --row ID`` checks a whole compressed run the same way: the run of
``ID`` in a run directory, judged against the kept dense curve, must give the kept row's figures (final loss,
peak, bytes, steps to each target, every evaluation).

``price`` times a kept seed's static rows with the step prices another kept seed holds
(:mod:`ds_gravac_bench.kept_prices`): one step-time invocation per rate prices every seed of a table, after its raw
runs have left with their machine.
"""
from __future__ import annotations

import argparse
import base64
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from ds_gravac_bench.fidelity import add_run_arguments, noise_floor, row_verdict, run
from ds_gravac_bench.fidelity_args import cluster_arg, clusters_of
from ds_gravac_bench.fidelity_judge import peak_rises
from ds_gravac_bench.fidelity_seeds import seed_table
from ds_gravac_bench.keep import strip_paths
from ds_gravac_bench.kept_prices import price_like
from ds_gravac_bench.fidelity_runs import curve_of
from ds_gravac_bench.machine_check import CHECK_SECONDS, REMEDY, check_restored, first_difference, mark_restored
from ds_gravac_bench.report import read_steps, shown_path

REPORT_FILE, REFERENCE_FILE = "fidelity.json", "reference.json"


def _encode(values: list[float]) -> dict[str, str]:
    """Losses bit for bit: float32 when every value is one (the runners log a float32 tensor's item)."""
    dtype = "float32" if all(float(np.float32(v)) == v for v in values) else "float64"
    return {"dtype": dtype, "base64": base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode()}


def _decode(packed: dict[str, str]) -> list[float]:
    return [float(v) for v in np.frombuffer(base64.b64decode(packed["base64"]), dtype=packed["dtype"])]


def _runs_of(values: list[Any]) -> list[list[Any]]:
    """``[[value, count], ...]``: a dense run's bytes are one value repeated over every step."""
    out: list[list[Any]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def compact_curve(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the reports read of a run's steps: loss, bytes and evaluations exactly; the median step time."""
    return {"steps": [int(r["step"]) for r in records] if any(int(r["step"]) != i + 1 for i, r in enumerate(records))
            else len(records),
            "loss": _encode([float(r["loss"]) for r in records]),
            "bytes_sent": _runs_of([r.get("bytes_sent") for r in records]),
            "median_step_s": curve_of(records)["median_step"],      # the median the reports read
            "evals": [{k: r[k] for k in sorted(r) if k == "step" or k.startswith("eval/")}   # stable over restores
                      for r in records if any(k.startswith("eval/") for k in r)]}


def expand_curve(curve: dict[str, Any], system: str) -> list[dict[str, Any]]:
    """Step records rebuilt from :func:`compact_curve` (every step timed at the kept median)."""
    steps = curve["steps"] if isinstance(curve["steps"], list) else list(range(1, curve["steps"] + 1))
    sent = [v for v, n in curve["bytes_sent"] for _ in range(n)]
    evals = {int(e["step"]): e for e in curve["evals"]}
    return [{"step": s, "loss": loss, "bytes_sent": b, "time/step": curve["median_step_s"], "system": system,
             **evals.get(s, {})} for s, loss, b in zip(steps, _decode(curve["loss"]), sent)]


def write_report(kept: Path, table: dict[str, Any]) -> None:
    """The kept report as every writer leaves it (indent 1, a final newline): rewrites diff row by row."""
    (kept / REPORT_FILE).write_text(json.dumps(table, indent=1) + "\n")


def save(run_dir: Path, kept: Path, clusters: Optional[dict[str, list[Path]]] = None) -> dict[str, Any]:
    """Write (or extend) ``kept`` from ``run_dir``: the merged report and the dense reference run."""
    earlier = [kept] if (kept / REPORT_FILE).is_file() else []
    table = strip_paths(seed_table([run_dir, *earlier], clusters or {}))
    ref = table["reference"]
    meta = json.loads((run_dir / "meta.json").read_text())
    config = run_dir / "configs" / f"{ref}.json"
    reference = {"system": ref, "meta": strip_paths({**meta, "systems": {ref: meta["systems"][ref]}}),
                 "config": json.loads(config.read_text()) if config.is_file() else None,
                 "curve": compact_curve(read_steps(run_dir / "systems" / ref / "steps.jsonl"))}
    if (kept / REFERENCE_FILE).is_file():
        previous = json.loads((kept / REFERENCE_FILE).read_text())
        if all(previous.get(k) == reference[k] for k in ("system", "config", "curve")):
            reference["meta"] = previous["meta"]      # the run that made the curve, not the latest invocation's
    kept.mkdir(parents=True, exist_ok=True)
    write_report(kept, table)
    (kept / REFERENCE_FILE).write_text(json.dumps(reference, indent=1) + "\n")
    return table


def restore(kept: Path, run_dir: Path, task: Optional[str] = None, seed: Optional[int] = None) -> str:
    """Write the kept dense run into ``run_dir`` as a finished system; returns its id. A directory that already
    holds runs is refused: its own dense run (or another one) would be overwritten; so is a kept run of another
    ``task`` or ``seed`` than the caller's (every row trained after it would be judged against the wrong dense)."""
    if (run_dir / "meta.json").exists():
        raise SystemExit(f"long_keep: {run_dir} already holds runs (meta.json); restore into a new directory")
    reference = json.loads((kept / REFERENCE_FILE).read_text())
    made = (reference.get("meta") or {}).get("fidelity") or {}
    asked = {k: v for k, v in (("task", task), ("seed", seed)) if v is not None}
    if any(made.get(k) != v for k, v in asked.items()):
        raise SystemExit(f"long_keep: {kept} keeps the dense run of task {made.get('task')!r}, seed "
                         f"{made.get('seed')!r}, not {asked.get('task', made.get('task'))!r}, seed "
                         f"{asked.get('seed', made.get('seed'))!r}")
    ref = reference["system"]
    (run_dir / "systems" / ref).mkdir(parents=True)
    (run_dir / "configs").mkdir(exist_ok=True)
    records = expand_curve(reference["curve"], ref)
    (run_dir / "systems" / ref / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if reference["config"] is not None:
        (run_dir / "configs" / f"{ref}.json").write_text(json.dumps(reference["config"], indent=1))
    (run_dir / "meta.json").write_text(json.dumps(reference["meta"], indent=1))
    mark_restored(run_dir, ref, shown_path(kept), (reference.get("meta") or {}).get("env"))
    return ref


def match(kept: Path, run_dir: Path) -> tuple[int, Optional[int]]:
    """(steps compared, the first step whose loss differs from the kept dense curve's, None when none does) for
    the dense run in ``run_dir``, as far as both go."""
    reference = json.loads((kept / REFERENCE_FILE).read_text())
    steps = run_dir / "systems" / reference["system"] / "steps.jsonl"
    if not steps.is_file():
        raise SystemExit(f"long_keep match: {run_dir} holds no run of {reference['system']} (no {steps.name})")
    n, differs = first_difference(expand_curve(reference["curve"], reference["system"]), read_steps(steps))
    if n == 0:
        raise SystemExit(f"long_keep match: {steps} holds no step yet")
    return n, differs


ROW_FIELDS = ("final_loss", "peak", "bytes_ratio", "steps_to_target", "steps_to_top1", "evals", "eval")


def match_row(kept: Path, run_dir: Path, row: str) -> list[str]:
    """The fields of the kept row ``row`` that ``run_dir``'s run of that system gives otherwise ([]: the kept
    row, figure for figure). The run is judged against the kept dense curve, as the kept row was, so a run
    directory of another machine needs no dense run of its own."""
    table = json.loads((kept / REPORT_FILE).read_text())
    rows = {r["id"]: r for r in table["systems"]}
    if row not in rows:
        raise SystemExit(f"long_keep match: {kept} holds no row {row!r}; its rows: {', '.join(map(repr, rows))}")
    steps = run_dir / "systems" / row / "steps.jsonl"
    if not steps.is_file():
        raise SystemExit(f"long_keep match: {run_dir} holds no run of {row} (no {steps.name})")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "run"
        restore(kept, scratch)
        meta = json.loads((scratch / "meta.json").read_text())
        meta["systems"][row] = json.loads((run_dir / "meta.json").read_text())["systems"][row]
        (scratch / "meta.json").write_text(json.dumps(meta))
        config = run_dir / "configs" / f"{row}.json"
        if config.is_file():
            shutil.copy(config, scratch / "configs" / config.name)
        (scratch / "systems" / row).mkdir()
        shutil.copy(steps, scratch / "systems" / row / steps.name)
        rebuilt = {r["id"]: r for r in seed_table([scratch], {})["systems"]}
    as_kept = json.loads(json.dumps(rebuilt[row]))       # tuples become the lists a kept report holds
    return [k for k in ROW_FIELDS if as_kept.get(k) != rows[row].get(k)]


def drop(kept: Path, ids: Sequence[str]) -> dict[str, Any]:
    """Remove the rows ``ids`` from ``kept``'s report; the rest stays as it was but for the noise floor, which is
    recomputed from the rows left (it is the noise control's row). The dense reference and an id the report does
    not hold are refused, naming the ids it holds, before anything is written."""
    path = kept / REPORT_FILE
    if not path.is_file():
        raise SystemExit(f"long_keep drop: {kept} holds no {REPORT_FILE}")
    table = json.loads(path.read_text())
    held = [r["id"] for r in table["systems"]]
    if table["reference"] in ids:
        raise SystemExit(f"long_keep drop: {table['reference']!r} is the reference every row is judged against")
    missing = [i for i in ids if i not in held]
    if missing:
        raise SystemExit(f"long_keep drop: {kept} holds no row {', '.join(map(repr, missing))}; "
                         f"its rows: {', '.join(map(repr, held))}")
    table["systems"] = [r for r in table["systems"] if r["id"] not in ids]
    table["noise_floor"] = noise_floor(table["systems"], table["reference"])
    write_report(kept, table)
    return table


def rejudge(kept: Path) -> dict[str, Any]:
    """Each kept row's rise and verdict under the current bounds. A row keeps its smoothed peak, and every system's
    first loss on a seed is dense's (the same weights and batch, before any update), so "above its start and
    dense's peak" is above dense's peak."""
    table = json.loads((kept / REPORT_FILE).read_text())
    ref_id = table["reference"]
    dense = next(r for r in table["systems"] if r["id"] == ref_id)
    for r in table["systems"]:
        r["rises"] = peak_rises(r["peak"], start=dense["peak"], dense_peak=dense["peak"])  # its start ≤ dense's peak
        r["verdict"] = row_verdict(r, dense, ref_id)
    write_report(kept, table)
    return table


def run_and_keep(opts: argparse.Namespace) -> Path:
    """``fidelity run`` that saves into ``opts.keep`` after every finished system."""
    loopback = opts.rate == "loopback"
    if not loopback and opts.against is None:
        raise SystemExit("long_keep run: --rate needs --against DIR, the seed's loopback run directory (dense)")

    seed_dir = Path(opts.out) if loopback and opts.out else opts.against
    if seed_dir is not None and not (seed_dir / "meta.json").exists() and (opts.keep / REFERENCE_FILE).is_file():
        ref = restore(opts.keep, seed_dir, opts.task, opts.seed)   # on another machine: train only what it lacks
        print(f"[long_keep] {seed_dir}: {ref} restored from {opts.keep}", flush=True)
    if not loopback:        # the controllers' rows are judged against that loopback dense run: this machine's?
        check_restored(opts.against, lambda check_dir, sid: run(argparse.Namespace(**{
            **vars(opts), "rate": "loopback", "systems": sid, "out": str(check_dir), "timeout": CHECK_SECONDS,
            "checkpoint_every": 0, "reference_steps": 0})))

    def keep_now(out: Path, sid: str) -> None:
        table = save(out, opts.keep) if loopback else save(opts.against, opts.keep, {opts.rate: [out]})
        print(f"[long_keep] {sid} finished: {opts.keep} keeps {len(table['systems'])} rows", flush=True)

    return run(opts, keep_now)


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("run", help="fidelity run, saving into --keep after every system that finishes")
    add_run_arguments(k)
    k.add_argument("--keep", type=Path, required=True, help="the kept directory, e.g. docs/bench/long/<task>-s<seed>")
    k.add_argument("--against", type=Path, default=None,
                   help="with --rate: the seed's loopback run directory that the controllers' rows are judged against")
    s = sub.add_parser("save", help="keep a run directory's report and dense run (extends an earlier save)")
    s.add_argument("run_dir", type=Path)
    s.add_argument("kept", type=Path)
    s.add_argument("--cluster", action="append", type=cluster_arg, default=[], metavar="RATE=DIR",
                   help="cluster runs at RATE: the controllers' rows trained there are kept too, and step-time "
                        "runs price every static row at RATE, so fidelity_seeds needs only the kept directory")
    r = sub.add_parser("restore", help="write a kept dense run into a new run directory")
    r.add_argument("kept", type=Path)
    r.add_argument("run_dir", type=Path)
    d = sub.add_parser("drop", help="remove rows from a kept report by id")
    d.add_argument("kept", type=Path)
    d.add_argument("ids", nargs="+", metavar="ROW_ID", help="a row's id as the report holds it, e.g. 'gv_auto at 1gbit'")
    j = sub.add_parser("rejudge", help="apply the current accuracy bounds to kept reports")
    j.add_argument("kept", type=Path, nargs="+")
    m = sub.add_parser("match", help="is a run directory's dense curve the kept one, bit for bit (this machine's?)")
    m.add_argument("kept", type=Path)
    m.add_argument("run_dir", type=Path)
    m.add_argument("--row", help="compare this kept row (a system's id) with the run directory's run of it instead")
    p = sub.add_parser("price", help="time a kept seed's static rows with the step prices another kept seed holds")
    p.add_argument("kept", type=Path)
    p.add_argument("--like", type=Path, required=True, help="a kept seed of the same table, priced by step-time runs")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        print(f"[long_keep] {run_and_keep(a)}: done")
    elif a.cmd == "save":
        table = save(a.run_dir, a.kept, clusters_of(a.cluster))
        print(f"[long_keep] {a.kept}: {len(table['systems'])} systems kept "
              f"({', '.join(r['id'] for r in table['systems'])})")
    elif a.cmd == "drop":
        table = drop(a.kept, a.ids)
        print(f"[long_keep] {a.kept}: dropped {', '.join(a.ids)}; {len(table['systems'])} rows kept")
    elif a.cmd == "match" and a.row:
        differ = match_row(a.kept, a.run_dir, a.row)
        if differ:
            raise SystemExit(f"[long_keep] {a.run_dir}: {a.row} differs from {a.kept}'s row in {', '.join(differ)}")
        print(f"[long_keep] {a.run_dir}: {a.row} gives {a.kept}'s row ({', '.join(ROW_FIELDS)} equal)")
    elif a.cmd == "match":
        n, differs = match(a.kept, a.run_dir)
        if differs is not None:
            raise SystemExit(f"[long_keep] {a.run_dir}: leaves {a.kept}'s dense curve at step {differs}: this machine "
                             f"trains another curve and cannot continue that seed as it is. {REMEDY}")
        print(f"[long_keep] {a.run_dir}: {a.kept}'s dense curve bit for bit over {n} steps")
    elif a.cmd == "price":
        table, priced = price_like(json.loads((a.kept / REPORT_FILE).read_text()),
                                   json.loads((a.like / REPORT_FILE).read_text()), a.like)
        write_report(a.kept, table)
        print(f"[long_keep] {a.kept}: priced like {a.like}: {', '.join(priced) or 'nothing left to price'}")
    elif a.cmd == "rejudge":
        for kept in a.kept:
            table = rejudge(kept)
            print(f"[long_keep] {kept}: " + "; ".join(f"{r['id']} {r['verdict']}" for r in table["systems"]))
    else:
        print(f"[long_keep] {a.run_dir}: {restore(a.kept, a.run_dir)} restored")


if __name__ == "__main__":
    main()
