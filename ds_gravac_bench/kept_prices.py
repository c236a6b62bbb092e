"""Time a kept seed's static rows with the step prices that another kept seed of the same table holds.

    python -m ds_gravac_bench.long_keep price docs/bench/long/resnet18_long-s0-intel \\
        --like docs/bench/long/resnet18_long-s1

Why: a table prices its static rows with one step-time invocation per rate (``long_keep save --cluster
RATE=<step-time run>``), because one system's step moves 15–27% between invocations. Those raw runs live under
``runs/`` and leave with their machine, but the kept reports of the seeds they priced hold each system's prices: its
median cluster step, or one per kind of step (a dense start's dense and compressed steps, post-local SGD's sending
and quiet steps). A seed kept later takes them from there, so every seed of the table stays priced by the same
invocation, with no re-measuring in another one.

A row is priced from the row of the same id in the other report, with its own steps to each target (and, for
post-local SGD, its own count of quiet steps): the same sums ``fidelity_time`` makes from the runs. Before a price
is used, the other row's kept times are re-derived from it and its own steps, and must match, so prices that are
not what timed that row are refused. A controller's time (its own run, or priced per branch) is its run's, never
transferred, and a rate at which a row already has a time keeps it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from ds_gravac_bench.fidelity_time import ONE_STEP
from ds_gravac_bench.report import shown_path
from ds_gravac_bench.step_kinds import KindPrice, priced_time
from ds_gravac_bench.systems import resolve_system, system_matrix

Prices = dict[str, KindPrice]


def entry_prices(entry: dict[str, Any]) -> Optional[Prices]:
    """The per-kind step prices a static row's rate entry was timed with; None for any other entry (a controller's
    own run, a time priced per branch, no cluster run)."""
    def price(key: str) -> KindPrice:
        return KindPrice(step_s=float(entry[key]), n=0)     # how many steps each median is of is not kept
    if entry.get("send_step_s") is not None:
        return {"send": price("send_step_s"), "quiet": price("quiet_step_s")}
    if entry.get("dense_start_step_s") is not None:
        return {"dense": price("dense_start_step_s"), "compressed": price("step_s")}
    if entry.get("source") == ONE_STEP and entry.get("step_s") is not None:
        return {"step": price("step_s")}
    return None


def dense_start_of(sid: str, budget: int) -> int:
    """Steps a static system sends dense before it compresses: its section's ``warmup_steps``, else the start its
    system records (PyTorch's PowerSGD hook), as ``fidelity_time.time_at_rate`` reads them."""
    spec = resolve_system(system_matrix(budget), sid)
    return int((spec.gravac or {}).get("warmup_steps", 0)) or int(spec.dense_start)


def _counts(prices: Prices, steps: int, quiet: Optional[int], warmup: int) -> Optional[dict[str, int]]:
    if "send" in prices:
        return None if quiet is None else {"send": steps - quiet, "quiet": quiet}
    if "dense" in prices:
        return {"dense": min(steps, warmup), "compressed": max(0, steps - warmup)}
    return {"step": steps}


def _time(prices: Prices, steps: Optional[int], quiet: Optional[int], warmup: int) -> Optional[float]:
    counts = _counts(prices, steps, quiet, warmup) if steps else None
    return priced_time(counts, prices) if counts else None


def price_entry(row: dict[str, Any], like: dict[str, Any], warmup: int) -> dict[str, Any]:
    """``row``'s entry at one rate from ``like``'s entry (the same system at that rate in another seed)."""
    prices = entry_prices(like)
    quiet = row.get("quiet_steps") or {}
    if "send" in prices and not quiet:
        raise SystemExit(f"long_keep price: row {row['id']!r} keeps no count of its quiet steps (quiet_steps), "
                         "which post-local SGD's prices need; save it again from its run directory")
    out: dict[str, Any] = {k: like[k] for k in ("step_s", "dense_start_step_s", "send_step_s", "quiet_step_s")
                           if k in like}
    if "send" in prices:                    # the mean step of this run: its own mix of sending and quiet steps
        out["step_s"] = _time(prices, quiet.get("steps"), quiet.get("all"), warmup) / quiet["steps"]
    out["time_s"] = _time(prices, row.get("steps_to_target"), quiet.get("to_target"), warmup)
    out["top1_time_s"] = _time(prices, row.get("steps_to_top1"), quiet.get("to_top1"), warmup)
    out["source"] = like["source"]
    return out


def _check_like(like_row: dict[str, Any], rate: str, entry: dict[str, Any], warmup: int, like_dir: Path) -> None:
    """The other row's own times must be its prices × its own steps: otherwise they are not prices to transfer."""
    again = price_entry(like_row, entry, warmup)
    for key in ("time_s", "top1_time_s"):
        kept, derived = entry.get(key), again[key]
        if (kept is None) != (derived is None) or (kept is not None and not math.isclose(kept, derived, rel_tol=1e-9)):
            raise SystemExit(f"long_keep price: {like_dir}'s row {like_row['id']!r} at {rate}: its {key} {kept} is not "
                             f"its prices × its own steps ({derived}); refusing to price with them")


def price_like(table: dict[str, Any], like: dict[str, Any], like_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """``table`` with every static row timed at each rate of ``like`` where ``like`` prices the same system and the
    row has no time yet; also each row's speed-up over dense at those rates. Returns the new table and the
    ``id at rate`` entries priced."""
    differ = [k for k in ("model", "steps", "target_fraction", "top1_margin") if table.get(k) != like.get(k)]
    if differ:
        raise SystemExit(f"long_keep price: {like_dir} is another table ({', '.join(differ)} differ): its prices "
                         "are for another task or budget")
    theirs = {r["id"]: r for r in like["systems"]}
    rates = sorted({rate for r in like["systems"] for rate in r.get("rates", {})})
    priced, rows = [], []
    for row in table["systems"]:
        row = {**row, "rates": dict(row.get("rates") or {})}
        other = theirs.get(row["id"])
        for rate in rates:
            entry = (other or {}).get("rates", {}).get(rate, {})
            mine = row["rates"].get(rate, {})
            controller = bool(row.get("trained_at") or row.get("adaptive"))
            timed = any(mine.get(k) is not None for k in ("step_s", "time_s", "top1_time_s"))
            if controller or timed or entry_prices(entry) is None:
                continue
            warmup = dense_start_of(row["id"], table["steps"])
            _check_like(other, rate, entry, warmup, like_dir)
            row["rates"][rate] = price_entry(row, entry, warmup)
            priced.append(f"{row['id']} at {rate}")
        rows.append(row)
    _speedups(rows, table["reference"], priced)
    at = {p.rsplit(" at ", 1)[1]: shown_path(like_dir) for p in priced}
    return {**table, "systems": rows, "priced_like": {**table.get("priced_like", {}), **at}}, priced


def _speedups(rows: list[dict[str, Any]], ref_id: str, priced: list[str]) -> None:
    """Dense's time to each target over the row's, in each entry priced here, as ``fidelity.build`` sets them."""
    dense = next(r for r in rows if r["id"] == ref_id)["rates"]
    for r in rows:
        for rate, mine in r["rates"].items():
            if f"{r['id']} at {rate}" not in priced:
                continue
            theirs = dense.get(rate, {})
            for key, out in (("time_s", "speedup"), ("top1_time_s", "top1_speedup")):
                mine[out] = theirs[key] / mine[key] if theirs.get(key) and mine.get(key) else None
