"""Markdown and CSV of scale tables: the full table of one rate (``table``), and the compact validation and
prediction tables of several rates side by side (``summary``, what docs/SCALE.md shows)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Optional, Sequence

def _fmt(x: Optional[float], digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def markdown(table: dict[str, Any]) -> str:
    """The table as Markdown: measured rows with their error, predicted rows labelled."""
    lines = [f"{table['model']}, {table['rate']}, kernels from the {table['kernels_from']}; comm = α–β fits "
             "(measured N: its own probe line; other N: the law). Compute at a measured N: each system's own compute "
             "estimate of the same run (\"error, compute-only\": a separate compute-only run's step instead).", "",
             "| system | N | status | step measured s (p10–p90) | step predicted s | error | error, compute-only | "
             "compute / codec / comm predicted s | comm wait measured s | MB/step measured / predicted | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        p, m = r["pred"], r.get("measured") or {}
        meas = f"{m['step_s']:.2f} ({m['step_p10_s']:.2f}–{m['step_p90_s']:.2f})" if "step_s" in m else "–"
        status = r["status"] + (" (oversubscribed)" if "oversubscribed" in r["compute_source"] else "")
        err, alt = (f"{100 * r[k]:+.1f}%" if r.get(k) is not None else "–" for k in ("error", "error_compute_only"))
        mb = f"{_fmt(m.get('bytes_sent', 0) / 1e6 if m.get('bytes_sent') else None)} / {p['bytes'] / 1e6:.2f}"
        load = r.get("load") or {}
        lines.append(f"| {r['system']} | {r['n']} | {status} | {meas} | {p['step']:.2f} | {err} | {alt} | "
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


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def summary(tables: Sequence[dict[str, Any]]) -> str:
    """Validation rows (measured N), predicted rows (other N), laws and crossovers of several rates."""
    rates = [t["rate"] for t in tables]
    rows = [{(r["system"], r["n"]): r for r in t["rows"]} for t in tables]
    systems = list(dict.fromkeys(r["system"] for r in tables[0]["rows"]))
    measured = sorted({k[1] for by in rows for k, r in by.items() if r["status"] == "measured"})
    predicted = sorted({k[1] for by in rows for k, r in by.items() if r["status"] == "predicted"})
    out = ["| system | N | " + " | ".join(f"{rate}: measured s | predicted s (compute / codec / comm) | error "
                                           f"(compute-only)" for rate in rates) + " |",
           "|---|---|" + "---|---|---|" * len(rates)]
    for sid in systems:
        for n in measured:
            cells = []
            for by in rows:
                r = by.get((sid, n))
                if r is None or r["status"] != "measured":
                    cells += ["–", "–", "–"]
                    continue
                p, m = r["pred"], r["measured"]
                over = " ‡" if "oversubscribed" in r["compute_source"] else ""
                cells += [f"{m['step_s']:.2f}", f"{p['step']:.2f} ({p['compute']:.2f} / {p['codec']:.2f} / "
                          f"{p['comm']:.2f}){over}", f"{_pct(r['error'])} ({_pct(r.get('error_compute_only'))})"]
            out.append(f"| {sid} | {n} | " + " | ".join(cells) + " |")
    out += ["", "| system | " + " | ".join(f"{rate}: **predicted** step at N = {', '.join(map(str, predicted))} s "
                                        f"(compute / codec / comm)" for rate in rates)
            + f" | MB/step at N = {', '.join(map(str, predicted))} |", "|---|" + "---|" * (len(rates) + 1)]
    for sid in systems:
        cells = ["; ".join(f"{p['step']:.2f} ({p['compute']:.2f} / {p['codec']:.2f} / {p['comm']:.2f})"
                           for p in (by[(sid, n)]["pred"] for n in predicted)) for by in rows]
        mb = ", ".join(f"{rows[0][(sid, n)]['pred']['bytes'] / 1e6:.1f}" for n in predicted)
        out.append(f"| {sid} | " + " | ".join(cells) + f" | {mb} |")
    out += ["", "| rate | op | α ms | β as Mbit/s | law vs probes, worst error per N |", "|---|---|---|---|---|"]
    for t in tables:
        for op, law in t["laws"].items():
            worst = ", ".join(f"{c['n']}: {_pct(c['law_max_err'])}" for c in t["law_check"] if c["op"] == op)
            out.append(f"| {t['rate']} | {op} | {1e3 * law['alpha_s']:.2f} | {_fmt(law['mbit_s'], 1)} | {worst} |")
    out += ["", "| all-gather system | against | " + " | ".join(f"{rate}: first N not faster" for rate in rates)
            + " |", "|---|---|" + "---|" * len(rates)]
    pairs = list(dict.fromkeys((c["system"], c["against"]) for t in tables for c in t["crossover"]))
    for sid, other in pairs:
        cells = []
        for t in tables:
            c = next((c for c in t["crossover"] if (c["system"], c["against"]) == (sid, other)), None)
            hit = None if c is None else c["first_n_not_faster"]
            cells.append("–" if c is None else str(hit) if hit else f"> {c['grid_max']}")
        out.append(f"| {sid} | {other} | " + " | ".join(cells) + " |")
    return "\n".join(out)
