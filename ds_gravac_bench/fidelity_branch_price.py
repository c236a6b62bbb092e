"""A controller's time to target at a rate its whole run was not made at: its steps counted per branch, each
branch priced by its median step in short segments measured at that rate.

Why: GraVAC with the paper's settings sends dense on about a third of `resnet18_long`'s steps, so its whole run at
100 Mbit/s would take about 4 hours, more than a working session. Past its candidate search its decisions read
only the gain against ε, not the link, so its whole run at another rate (1 Gbit/s) fixes which branch each step
sends. Segments at the target rate, a fresh start and resumes from checkpoints of the whole run, give each
branch's step there, with ``ddp_bf16`` timed in the same invocation (``fidelity run`` ends with it). The price
holds only where the segments retrace the whole run, the same branch and the same loss at every step both logged;
that is checked, and a segment that departs from the run is refused.

    python -m ds_gravac_bench.fidelity_branch_price --keep docs/bench/long/resnet18_long-s0
        --row 'gv_gravac@gravac.window=500 at 1gbit' --run runs/long/r18-s0-1gbit-gv --segments DIR [DIR ...]
        [--save 100mbit]

``--save RATE`` writes the priced times into the kept row as its time at that rate (source "priced per branch",
``ddp_bf16`` beside the segments as its reference step), so that ``lead.md`` shows them and issue 42's targets
compare against them as against a controller's own run.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.fidelity_lead import BASELINE
from ds_gravac_bench.fidelity_reference import reference_step
from ds_gravac_bench.fidelity_time import PRICED
from ds_gravac_bench.long_keep import REPORT_FILE, write_report
from ds_gravac_bench.report import SKIP_STEPS, read_steps
from ds_gravac_bench import step_kinds
from ds_gravac_bench.step_kinds import KindPrice

Record = dict[str, Any]


def branch_of(record: Record) -> str:
    """What a step sent: GraVAC's branch and the CF it sent (``dense@1``, ``min@10``, ``cand@20``). Accordion sends
    its high CF on some layers and its low one on the rest, so its steps also name the fraction of layers at the low
    level and the bytes sent (``cand@10 low 0.67 18.6 MB``): each layer pattern is a branch of its own."""
    branch = f"{record.get('branch', 'static')}@{float(record.get('cf_sent', 1.0)):g}"
    low = record.get("accordion/low_fraction")
    if low is None or record.get("branch") == "dense":
        return branch
    return f"{branch} low {float(low):.2f} {float(record.get('comm/bytes_sent', 0)) / 1e6:.1f} MB"


def departures(run: Sequence[Record], segment: Sequence[Record]) -> list[int]:
    """Steps both logged where the segment sent another branch or had another loss than the whole run."""
    sent = {int(r["step"]): (branch_of(r), r["loss"]) for r in run}
    return [int(r["step"]) for r in segment
            if int(r["step"]) in sent and sent[int(r["step"])] != (branch_of(r), r["loss"])]


def branch_prices(segments: Sequence[Sequence[Record]]) -> dict[str, KindPrice]:
    """Median step and count per branch over the segments, each past its first ``SKIP_STEPS`` steps (a start or a
    resume is not a representative step). A branch sent only in those steps (Accordion's one forced dense step at
    the start) is priced by them: a fresh segment's start is the run's own start at the segments' rate."""
    timed = [(i, branch_of(r), float(r["time/step"])) for segment in segments
             for i, r in enumerate(segment) if r.get("time/step") is not None]
    body = step_kinds.kind_prices((b, t) for i, b, t in timed if i >= SKIP_STEPS)
    start_only = step_kinds.kind_prices((b, t) for i, b, t in timed if i < SKIP_STEPS and b not in body)
    return dict(sorted({**body, **start_only}.items()))


def priced_time(run: Sequence[Record], upto: int, prices: dict[str, KindPrice]
                ) -> tuple[Optional[float], dict[str, int]]:
    """The run's first ``upto`` steps, each at its branch's price; None when a branch they send has no price."""
    counts = dict(Counter(branch_of(r) for r in run if int(r["step"]) <= upto))
    return step_kinds.priced_time(counts, prices), counts


def _kept_rows(keep: Path) -> dict[str, Record]:
    return {row["id"]: row for row in json.loads((keep / "fidelity.json").read_text())["systems"]}


def segment_runs(segment_dirs: Sequence[Path]) -> dict[tuple[Path, str], list[Record]]:
    """Every system's records in the segment directories (a ``fidelity run`` of controllers; its ``ddp_bf16``
    reference lies apart, in ``reference/``)."""
    return {(d, f.parent.name): read_steps(f) for d in segment_dirs for f in sorted(d.glob("systems/*/steps.jsonl"))}


def price_report(keep: Path, row_id: str, run_dir: Path, segment_dirs: Sequence[Path]) -> list[str]:
    """The lines the command prints (:func:`price`)."""
    return price(keep, row_id, run_dir, segment_dirs)[0]


def price(keep: Path, row_id: str, run_dir: Path, segment_dirs: Sequence[Path]
          ) -> tuple[list[str], dict[str, Any]]:
    """The lines the command prints: the segments' agreement with the run, each branch's price, and per target the
    priced time and its ratio against ``ddp_bf16`` timed in each segment's invocation; and the rate entry
    :func:`save_price` keeps. Segments of another setting of the same controller (GraVAC's other ε: the same
    branches, sent by the same code) add to the prices; only the row's own system's segments can be checked
    against its run."""
    rows = _kept_rows(keep)
    if row_id not in rows or BASELINE not in rows:
        missing = row_id if row_id not in rows else BASELINE
        raise SystemExit(f"fidelity_branch_price: {keep / REPORT_FILE} has no row {missing!r}; its rows: "
                         f"{', '.join(sorted(rows))}")
    row, base = rows[row_id], rows[BASELINE]
    system = row.get("system") or row_id        # a loopback row's id is its system's (a cluster row's is not)
    run = read_steps(run_dir / "systems" / system / "steps.jsonl")
    segments = segment_runs(segment_dirs)
    lines = []
    for (d, sid), seg in segments.items():
        steps = [int(r["step"]) for r in seg]
        span = f"steps {min(steps)}–{max(steps)}" if steps else "no steps"
        bad = departures(run, seg) if sid == system else []
        check = ("another setting: prices only" if sid != system else
                 f"departs from the run at steps {bad[:5]}" if bad else "retraces the run (branch and loss)")
        lines.append(f"segment {d.name}/{sid}: {span}, {check}")
        if bad:
            raise SystemExit("\n".join(lines) + "\nfidelity_branch_price: a segment departs from the whole run, "
                             "so the run's branches do not stand for that rate")
    prices = branch_prices(list(segments.values()))
    lines += [f"  {b}: {p['step_s']:.3f} s (median of {p['n']} steps)" for b, p in prices.items()]
    refs = [r["step_s"] for r in (reference_step(d) for d in segment_dirs) if r]
    if not refs:
        raise SystemExit(f"fidelity_branch_price: no {BASELINE} step measured beside the segments")
    ref_s = statistics.median(refs)
    lines.append(f"{BASELINE} beside the segments: {', '.join(f'{x:.3f}' for x in refs)} s (median {ref_s:.3f})")
    own_prices = branch_prices([run])            # the run priced by its own steps: the model's error at its rate
    entry: dict[str, Any] = {"step_s": None, "time_s": None, "top1_time_s": None, "source": PRICED,
                             "reference": {"system": BASELINE, "step_s": ref_s}}
    for name, key, time_key in (("loss target", "steps_to_target", "time_s"),
                                ("held-out target", "steps_to_top1", "top1_time_s")):
        upto, base_steps = row.get(key), base.get(key)
        if not upto or not base_steps:
            lines.append(f"{name}: not reached")
            continue
        time_s, counts = priced_time(run, int(upto), prices)
        mix = ", ".join(f"{b} × {n}" for b, n in sorted(counts.items()))
        if time_s is None:
            lines.append(f"{name}: step {upto} ({mix}): a branch has no price in the segments")
            continue
        entry[time_key] = time_s
        lines.append(f"{name}: step {upto} ({mix}): {time_s:,.0f} s; {BASELINE} {base_steps} × {ref_s:.3f} s = "
                     f"{base_steps * ref_s:,.0f} s; × {BASELINE}: {base_steps * ref_s / time_s:.2f}")
        own_s, _ = priced_time(run, int(upto), own_prices)
        measured = sum(float(r.get("time/step") or 0) for r in run if int(r["step"]) <= int(upto))
        lines.append(f"  the model at the run's own rate: {own_s:,.0f} s priced per branch, {measured:,.0f} s "
                     f"measured ({own_s / measured - 1:+.1%})")
    return lines, entry


def save_price(keep: Path, row_id: str, rate: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` as the row's time at ``rate``. A row trained at that rate has its own run's time there, which a
    price from segments must not replace."""
    report = json.loads((keep / REPORT_FILE).read_text())
    row = next((r for r in report["systems"] if r["id"] == row_id), None)
    if row is None:
        raise SystemExit(f"fidelity_branch_price: {keep / REPORT_FILE} has no row {row_id!r}")
    if row.get("trained_at") == rate:
        raise SystemExit(f"fidelity_branch_price: {row_id!r} was trained at {rate}: its own run's time stands there")
    row["rates"] = {**row.get("rates", {}), rate: entry}
    write_report(keep, report)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", type=Path, required=True, help="a kept table directory (its fidelity.json)")
    p.add_argument("--row", required=True, help="the kept row of the controller's whole run (at a rate, or loopback)")
    p.add_argument("--run", type=Path, required=True, help="the whole run's directory (cluster or loopback)")
    p.add_argument("--segments", type=Path, nargs="+", required=True,
                   help="fidelity run directories at the target rate holding segments of the same system")
    p.add_argument("--save", metavar="RATE", default=None,
                   help="keep the priced times in the row as its time at RATE, the segments' link rate")
    args = p.parse_args(argv)
    lines, entry = price(args.keep, args.row, args.run, args.segments)
    print("\n".join(lines))
    if args.save:
        save_price(args.keep, args.row, args.save, entry)
        print(f"kept as {args.row!r} at {args.save} ({PRICED})")


if __name__ == "__main__":
    main()
