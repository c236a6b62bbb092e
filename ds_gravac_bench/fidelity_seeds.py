"""Fidelity over several seeds: the accuracy bounds judged on the mean of independent runs.

    python -m ds_gravac_bench.fidelity_seeds runs/fidelity-resnet101-seed0 runs/fidelity-resnet101-seed1,more-seed1 \\
        runs/fidelity-resnet101-seed2 --out runs/fidelity-resnet101-seeds

Why: on a short budget a single run's loss at a given step depends on its trajectory as much as on the method.
Once any perturbation — another seed, or even a gradient rounded to fp16 — sends a run down a different
trajectory, the loss at equal steps can differ by tens of percent between runs of equally good methods (on
ResNet101 at 300 steps dense itself ends at 0.41, 0.56 and 0.83 on three seeds). A 5% bound can only be judged on
several samples. Each argument is one seed: a ``fidelity run`` directory, several of the same seed joined by
commas (merged as ``fidelity report`` merges them), or a directory holding only a report's ``fidelity.json``
(what a kept result holds), alone or joined to runs or reports of the same dense run. Systems are matched
across seeds by what they train (the hash of their "gravac" section), so a configuration run as ``gv_topk_10`` on
one seed and as ``cfg:…recommended.json`` on another counts once; every seed is compared with its own dense run,
then the per-seed figures are averaged: the loss bound on the mean final loss against dense's mean, top-1 and perplexity
likewise, bytes on the mean ratio. The steps to dense's target are listed per seed. With ``--cluster RATE=DIR``
(as for ``fidelity report``; step times do not depend on the seed) each seed's time to its target is steps × the
system's median cluster step — for a kept report too, from the steps to target it records — and the speed-up is
dense's mean time to target over the system's (the expected time to dense's accuracy); it is left out when the
system missed the target on some seed.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.fidelity import build, noise_floor
from ds_gravac_bench.fidelity_args import cluster_arg, clusters_of, rate_file_arg
from ds_gravac_bench.fidelity_judge import judged
from ds_gravac_bench.fidelity_runs import cluster_runs, load_dirs, match_key
from ds_gravac_bench.fidelity_lead import lead_markdown
from ds_gravac_bench.fidelity_targets import target_lines
from ds_gravac_bench.fidelity_output import NOISE_CONTROL
from ds_gravac_bench.fidelity_time import ONE_STEP, PRICED, time_at_rate
from ds_gravac_bench.report import shown_path


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if len(vals) == len(xs) and vals else None


def _is_report(path: Path) -> bool:
    return not (path / "systems").is_dir() and (path / "fidelity.json").is_file()


def seed_table(dirs: Sequence[Path], clusters: dict[str, list[Path]]) -> dict[str, Any]:
    """One seed's fidelity table: the run directories built together, then the reports the other directories
    already hold appended, first occurrence of a system winning. Reports keep no loss curve, so they merge only
    when their dense run ended exactly as the first table's (final loss, peak and steps to target equal: a
    machine that reproduces the dense run bit for bit, as DeepSpeed's deterministic CPU path does)."""
    runs = [d for d in dirs if not _is_report(d)]
    tables = ([build(runs, clusters)] if runs else []) + [_with_rates(json.loads((d / "fidelity.json").read_text()),
                                                                      clusters) for d in dirs if _is_report(d)]
    first = tables[0]
    ref = _reference(first)
    for other in tables[1:]:
        theirs = _reference(other)
        differ = [f"{k} {first.get(k)} vs {other.get(k)}" for k in ("model", "steps", "target_loss", "top1_target")
                  if first.get(k) != other.get(k)]
        differ += [f"dense's {k} {ref.get(k)} vs {theirs.get(k)}"
                   for k in ("final_loss", "peak", "steps_to_target", "steps_to_top1") if ref.get(k) != theirs.get(k)]
        if differ:
            raise SystemExit(f"fidelity_seeds: {', '.join(map(str, dirs))} hold different dense runs or targets "
                             f"({'; '.join(differ)}): not one seed (a kept report saved under an older target "
                             "rule: move it aside and save again from its run directories)")
        seen = {r["id"] for r in first["systems"]}
        rows = [_keep_rates(r, other["systems"]) for r in first["systems"]]
        first = {**first, "systems": rows + [r for r in other["systems"] if r["id"] not in seen],
                 **_merged_sources(first, other)}
    return {**first, "noise_floor": noise_floor(first["systems"], first["reference"])}   # a kept control counts


def _merged_sources(first: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Both tables' run directories and cluster directories per rate (first's first): the rows kept from
    ``other`` came from its directories, and a report's rate columns are its ``clusters``' rates."""
    def union(a: str, b: str) -> str:
        parts = [p for p in (a.split(", ") if a else []) + (b.split(", ") if b else []) if p]
        return ", ".join(dict.fromkeys(parts))
    mine, theirs = first.get("clusters") or {}, other.get("clusters") or {}
    clusters = {rate: union(mine.get(rate, ""), theirs.get(rate, "")) for rate in [*mine, *theirs]}
    runs = list(dict.fromkeys([*first.get("runs", []), *other.get("runs", [])]))
    return {"clusters": clusters, "runs": runs}


def _keep_rates(row: dict[str, Any], others: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``row`` with the rates an earlier report's row of the same run timed and ``row`` lacks: a loopback directory
    saved again without its cluster runs keeps the times they gave (same section, same steps to each target)."""
    same = ("section_hash", "steps_to_target", "steps_to_top1")
    earlier = next((o for o in others if o["id"] == row["id"] and all(o.get(k) == row.get(k) for k in same)), None)
    if earlier is None or not earlier.get("rates"):
        return row
    return {**row, "rates": _timed_first(earlier["rates"], row.get("rates", {}))}


def _timed(entry: dict[str, Any]) -> bool:
    """A rate entry holds a time: a median step, or a time to a target priced per branch (no one median step)."""
    return any(entry.get(k) is not None for k in ("step_s", "time_s", "top1_time_s"))


def _timed_first(kept: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """Per rate, ``fresh``'s time where it has one, else ``kept``'s: a directory that did not run a system at a
    rate ("no cluster run", "trained at 1gbit") never erases the time a kept report holds for it there."""
    out = dict(kept)
    for rate, t in fresh.items():
        if _timed(t) or not _timed(out.get(rate, {})):
            out[rate] = t
    return out


def _with_rates(table: dict[str, Any], clusters: dict[str, list[Path]]) -> dict[str, Any]:
    """A kept report with its time to target at every rate of ``clusters``: it holds no loss curve, but each row's
    steps to target and section hash, and the cluster runs hold the sections, so the time is computed as
    ``fidelity report`` computes it from runs (a controller's row from its own cluster run and the report's target)."""
    if not clusters:
        return table
    at_rate = {}
    for rate, paths in clusters.items():
        sections = load_dirs(paths)[2]
        at_rate[rate] = (cluster_runs(paths), {match_key(sid, sec): sec for sid, sec in sections.items()})
    rows = []
    for row in table["systems"]:
        if row.get("trained_at"):          # its time is its own run's, kept in the report
            rows.append(row)
            continue
        fresh = {}
        for rate, (runs, section_of) in at_rate.items():
            section = section_of.get(row.get("section_hash", ""))
            run = runs.get(row["id"]) or runs.get(match_key(row["id"], section))
            fresh[rate] = time_at_rate(run, row["steps_to_target"], section, table["target_loss"],
                                       row.get("steps_to_top1"), table.get("top1_target"), row.get("quiet_steps"))
        rows.append({**row, "rates": _timed_first(row.get("rates", {}), fresh)})
    return {**table, "systems": rows}


def _reference(table: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in table["systems"] if r["id"] == table["reference"])


def _mean_times(per: Sequence[dict[str, Any]]) -> dict[str, Optional[float]]:
    """Rate → mean time to target over the seeds (None when a seed has no time there)."""
    rates = set().union(*(r.get("rates", {}) for r in per))
    return {rate: _mean([r.get("rates", {}).get(rate, {}).get("time_s") for r in per]) for rate in sorted(rates)}


def _reference_steps(per: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Rate → the mean over the seeds of the baseline's step measured beside a controller's own run there
    (:mod:`ds_gravac_bench.fidelity_reference`); a rate where some seed has none is left out."""
    rates = set().union(*(r.get("rates", {}) for r in per))
    steps = {rate: _mean([(r.get("rates", {}).get(rate, {}).get("reference") or {}).get("step_s") for r in per])
             for rate in sorted(rates)}
    return {rate: s for rate, s in steps.items() if s is not None}


def _sourced(per: Sequence[dict[str, Any]], rate: str, source: str) -> bool:
    """Every seed's time at ``rate`` came the same way: one median step (rounds may re-price it), or priced per
    branch (a controller's run at another rate)."""
    return all(r.get("rates", {}).get(rate, {}).get("source") == source for r in per)


def combine(seeds: Sequence[Sequence[Path]], clusters: Optional[dict[str, list[Path]]] = None,
            rounds: Optional[dict[str, Path]] = None) -> dict[str, Any]:
    """Per-system figures of every seed and their means; a system counts only where every seed ran it. ``rounds``:
    rate → a ``step_times`` file measured in rounds, whose per-round medians the leading table pairs."""
    tables = [seed_table(dirs, clusters or {}) for dirs in seeds]
    if len({t["model"] for t in tables}) != 1:
        raise SystemExit("fidelity_seeds: the runs trained different models")
    key = _matching_key(tables)
    by_seed = [_rows_by(key, t["systems"]) for t in tables]
    dense = [_reference(t) for t in tables]
    rows = []
    for first in tables[0]["systems"]:
        per = [rows_of.get(first[key]) for rows_of in by_seed]
        if any(r is None for r in per) or per[0] is not first:
            continue                # missing from a seed, or the same configuration already listed under another id
        sid = first["id"]
        final, dense_final = _mean([r["final_loss"] for r in per]), _mean([r["dense_loss"] for r in per])
        top1 = _mean([r["eval"].get("eval/top1") for r in per])
        dense_top1 = _mean([d["eval"].get("eval/top1") for d in dense])
        ppl = _mean([r["eval"].get("eval/ppl") for r in per])
        dense_ppl = _mean([d["eval"].get("eval/ppl") for d in dense])
        row = {"id": sid, "also": sorted({r["id"] for r in per} - {sid}), "family": per[0]["family"],
               "trained_at": per[0].get("trained_at"),
               "adaptive": per[0].get("adaptive", False), "gaps": [r["gap"] for r in per],
               "steps_to_target": [r["steps_to_target"] for r in per],
               "dense_steps_to_target": [d["steps_to_target"] for d in dense],
               "final_loss": final, "dense_loss": dense_final, "gap": final / dense_final - 1.0,
               "top1": top1, "dense_top1": dense_top1, "ppl": ppl, "dense_ppl": dense_ppl,
               "bytes_ratio": _mean([r["bytes_ratio"] for r in per]), "rises": any(r["rises"] for r in per),
               "time_s": _mean_times(per), "dense_time_s": _mean_times(dense),
               "reference_step_s": _reference_steps(per)}
        row["speedup"] = {rate: row["dense_time_s"].get(rate) / t if t and row["dense_time_s"].get(rate) else None
                          for rate, t in row["time_s"].items()}
        row["one_step"] = {rate: _sourced(per, rate, ONE_STEP) for rate in row["time_s"]}
        row["priced_at"] = [rate for rate in row["time_s"] if _sourced(per, rate, PRICED)]
        row.update(_paired(per, dense))
        row["verdict"] = _verdict(row, tables[0]["reference"])
        rows.append(row)
    floor = next((r for r in rows if r["id"] == NOISE_CONTROL), None)
    return {"model": tables[0]["model"], "steps": tables[0]["steps"],
            "held_out_target": all(t.get("top1_target") is not None for t in tables),   # each seed's dense sets one
            "seeds": [[shown_path(p) for p in s] for s in seeds], "rounds": round_medians(rounds or {}),
            "noise_floor": None if floor is None else {k: floor[k] for k in ("gaps", "top1_diff", "steps_to_target")},
            "systems": rows}


def round_medians(files: dict[str, Path]) -> dict[str, Any]:
    """Rate → the file it came from and, per system, its median step in each round (``step_times`` with a rate
    given several times)."""
    out: dict[str, Any] = {}
    for rate, path in files.items():
        kept = json.loads(Path(path).read_text())
        at = kept.get("rates", {}).get(rate)
        if at is None or int(at.get("rounds", 1)) < 2:
            raise SystemExit(f"fidelity_seeds: {path} holds no rounds at {rate}")
        out[rate] = {"file": shown_path(Path(path)), "rounds": int(at["rounds"]),
                     "systems": {sid: row["round_medians"] for sid, row in at["systems"].items()
                                 if len(row.get("round_medians", [])) == int(at["rounds"])}}
    return out


def _spread(xs: Sequence[Optional[float]]) -> Optional[dict[str, float]]:
    """Mean and sample standard deviation (0 for one seed) of per-seed values; None when a seed has none."""
    vals = [x for x in xs if x is not None]
    if len(vals) != len(xs) or not vals:
        return None
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def _paired(per: Sequence[dict[str, Any]], dense: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Final held-out top-1 and perplexity as mean ± spread, top-1's paired difference to the same seed's dense
    run as mean ± spread, the steps to the held-out target per seed, and the mean time to it per rate (the
    verdict's second target)."""
    top1 = [r["eval"].get("eval/top1") for r in per]
    dense_top1 = [d["eval"].get("eval/top1") for d in dense]
    diffs = [a - b if a is not None and b is not None else None for a, b in zip(top1, dense_top1)]
    rates = set().union(*(r.get("rates", {}) for r in [*per, *dense]))
    top1_time = {rate: _mean([r.get("rates", {}).get(rate, {}).get("top1_time_s") for r in per])
                 for rate in sorted(rates)}
    dense_time = {rate: _mean([d.get("rates", {}).get(rate, {}).get("top1_time_s") for d in dense])
                  for rate in sorted(rates)}
    return {"top1_spread": _spread(top1), "top1_diff": _spread(diffs),
            "ppl_spread": _spread([r["eval"].get("eval/ppl") for r in per]),
            "steps_to_top1": [r.get("steps_to_top1") for r in per],
            "dense_steps_to_top1": [d.get("steps_to_top1") for d in dense],
            "top1_time_s": top1_time,
            "top1_speedup": {rate: dense_time[rate] / t if t and dense_time[rate] else None
                             for rate, t in top1_time.items()}}


def _matching_key(tables: Sequence[dict[str, Any]]) -> str:
    """Seeds are matched on what a system trains (its "gravac" section's hash) when every report records it, so the
    same configuration run under two ids (``gv_topk_10`` and ``cfg:lstm_recommended.json``) is one system; reports
    written before the hash existed are matched on the id."""
    hashed = all("section_hash" in r for t in tables for r in t["systems"])
    return "section_hash" if hashed else "id"


def _rows_by(key: str, rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The first row of each key (a seed that ran one configuration twice contributes its first run)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(r[key], r)
    return out


def _verdict(row: dict[str, Any], reference: str) -> str:
    """As :func:`ds_gravac_bench.fidelity.row_verdict`, on the means: a dense control is judged on accuracy alone."""
    if row["id"] == reference:
        return "reference"
    return judged(row["family"], row["final_loss"], row["dense_loss"], row["top1"], row["dense_top1"], row["ppl"],
                  row["dense_ppl"], row["bytes_ratio"], row["rises"], prefix="mean ")


def markdown(res: dict[str, Any]) -> str:
    n = len(res["seeds"])
    rates = sorted({rate for r in res["systems"] for rate in r["time_s"]})
    head = ["system", "gap per seed", "mean final loss (dense)", "gap of the means", "mean top-1 or perplexity (dense)",
            "bytes / dense", "steps to target per seed (dense)"]
    head += [f"{rate} mean time to target s (× dense)" for rate in rates] + ["bounds on the means"]
    floor = _floor_gap(res)
    floor_cell = f" (noise floor {100 * floor:.1f}%)" if floor is not None else ""
    lines = [f"# Fidelity over {n} seeds — {res['model']}, {res['steps']} steps, 2 ranks", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["systems"]:
        steps = ", ".join(f"{'–' if s is None else s} ({'–' if d is None else d})"
                          for s, d in zip(r["steps_to_target"], r["dense_steps_to_target"]))
        top1 = (f"{100 * r['top1']:.1f}% ({100 * r['dense_top1']:.1f}%)" if r["top1"] is not None
                else f"ppl {r['ppl']:.1f} ({r['dense_ppl']:.1f}), {100 * (r['ppl'] / r['dense_ppl'] - 1):+.1f}%"
                if r["ppl"] is not None and r["dense_ppl"] else "–")
        lines.append("| " + " | ".join([
            r["id"] + (f" (also {', '.join(r['also'])})" if r.get("also") else ""),
            ", ".join(f"{100 * g:+.0f}%" for g in r["gaps"]),
            f"{r['final_loss']:.3f} ({r['dense_loss']:.3f})", f"{100 * r['gap']:+.1f}%" + floor_cell, top1,
            "–" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:.3f}", steps]
            + [_time_cell(r, rate) for rate in rates] + [r["verdict"]]) + " |")
    return "\n".join(lines + _top1_table(res)) + "\n"


def _floor_gap(res: dict[str, Any]) -> Optional[float]:
    """The noise floor of a loss gap: the mean |gap| of ``ds_dense_jitter`` over the seeds."""
    floor = res.get("noise_floor")
    return statistics.fmean(abs(g) for g in floor["gaps"]) if floor and floor.get("gaps") else None


def _pm(spread: Optional[dict[str, float]], scale: float = 100.0, spec: str = ".1f") -> str:
    return "–" if spread is None else f"{scale * spread['mean']:{spec}} ± {scale * spread['sd']:{spec.lstrip('+')}}"


def _top1_table(res: dict[str, Any]) -> list[str]:
    """Final held-out top-1 as mean ± spread over the paired seeds, its paired difference to dense beside the noise
    floor's, steps to the held-out target per seed and the mean time to it per rate (absent without top-1)."""
    rows = [r for r in res["systems"] if r.get("top1_spread")]
    if not rows:
        return []
    rates = sorted({rate for r in rows for rate in r.get("top1_time_s", {})})
    floor = (res.get("noise_floor") or {}).get("top1_diff")
    head = ["system", "top-1 % (mean ± sd)", "top-1 − dense, points" + (f" (noise floor {_pm(floor, spec='+.2f')})"
                                                                    if floor else ""),
            "steps to top-1 target per seed (dense)"] + [f"{rate} mean time to top-1 s (× dense)" for rate in rates]
    lines = ["", "Held-out top-1 over the paired seeds (sd: sample standard deviation over seeds).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        steps = ", ".join(f"{'–' if a is None else a} ({'–' if b is None else b})"
                          for a, b in zip(r["steps_to_top1"], r["dense_steps_to_top1"]))
        times = [_pair_cell(r["top1_time_s"].get(rate), r["top1_speedup"].get(rate)) for rate in rates]
        lines.append("| " + " | ".join([r["id"], _pm(r["top1_spread"]), _pm(r["top1_diff"], spec="+.2f"), steps]
                                       + times) + " |")
    return lines


def _pair_cell(t: Optional[float], x: Optional[float]) -> str:
    return "–" if t is None else f"{t:.0f} ({x:.2f}×)" if x else f"{t:.0f}"


def _time_cell(row: dict[str, Any], rate: str) -> str:
    return _pair_cell(row["time_s"].get(rate), row["speedup"].get(rate))


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seeds", nargs="+", help="one argument per seed: a fidelity run dir, or several joined by ','")
    ap.add_argument("--cluster", action="append", type=cluster_arg, default=[], metavar="RATE=DIR",
                    help="bench_e2e run(s) on the emulated cluster at RATE (several DIRs joined by ','); repeatable")
    ap.add_argument("--rounds", action="append", type=rate_file_arg, default=[], metavar="RATE=FILE",
                    help="a step_times file measured in rounds at RATE: the leading table adds each static row's "
                         "ratio per round (min–max); repeatable, one per rate")
    ap.add_argument("--out", required=True, help="directory for seeds.md, seeds.json and lead.md (the leading table)")
    a = ap.parse_args(argv)
    res = combine([[Path(p) for p in arg.split(",")] for arg in a.seeds], clusters_of(a.cluster), dict(a.rounds))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(json.dumps(res, indent=1))
    (out / "seeds.md").write_text(markdown(res))
    (out / "lead.md").write_text(lead_markdown(res) + "".join(f"{line}\n" for line in target_lines(res)))
    print(markdown(res))


if __name__ == "__main__":
    main()
