"""Issue 42's time targets for ``auto``, printed under the leading table (``lead.md``) so that no one computes them
by hand: each ``auto`` row's own run at a rate against the best static setting within the bounds, against GraVAC
with the paper's settings (window 500) and against DDP + bf16.

The targets: ≥ 1.2× sooner than the best static and than GraVAC at 100 Mbit/s, ≥ 1.0× at 1 Gbit/s; ≥ 6× sooner
than ``ddp_bf16`` at 100 Mbit/s and ≥ 1.5× at 1 Gbit/s. A controller's own run is another invocation than the rows it
is compared with, so every comparison goes through the two ratios against ``ddp_bf16`` (each measured beside its
own run), never through seconds. Each is read against the noise floor in steps to target
(:func:`ds_gravac_bench.fidelity_lead.comparison_floor`): a target above 1 is "met" only beyond the floor (reached
inside it: "inside the floor"); a target of 1 missed inside the floor is "met within the floor"; else "missed".
"""
from __future__ import annotations

from typing import Any, Optional

from ds_gravac_bench.fidelity_lead import BASELINE, beyond, best_static, comparison_floor, ratios, timed_here

AUTO = "gv_auto"                                  # `auto` rows: `{}` (`gv_auto@auto.warmup_steps=50`) and variants
PAPER_GRAVAC = "gv_gravac@gravac.window=500"      # GraVAC with the paper's settings (ε 0.7; `@gravac.epsilon=0.9`)
TARGETS = {"100mbit": {"static": 1.2, "gravac": 1.2, BASELINE: 6.0},
           "1gbit": {"static": 1.0, "gravac": 1.0, BASELINE: 1.5}}


def verdict(q: float, target: float, floor: Optional[float]) -> str:
    """Ratio ``q`` (above 1: ``auto`` sooner) against ``target``, read against the noise floor."""
    if floor is None:
        return ("met" if q >= target else "missed") + " (no noise floor)"
    side = beyond(q, floor)
    if q >= target:
        return "met" if target <= 1 or side > 0 else "inside the floor"
    return "met within the floor" if target <= 1 and side == 0 else "missed"


def _own_run_at(row: dict[str, Any], rate: str, vs: dict[str, dict[str, Optional[float]]]) -> Optional[float]:
    """The row's ratio against the baseline at ``rate`` when its time there is its own (trained or priced per branch
    there; not another rate's run)."""
    return vs.get(row["id"], {}).get(rate) if timed_here(row, rate) else None


def target_lines(res: dict[str, Any]) -> list[str]:
    """One line per ``auto`` row, rate and comparison; empty without an ``auto`` row timed at a rate of ``TARGETS``."""
    vs, floor = ratios(res), comparison_floor(res)
    autos = [r for r in res["systems"] if r["id"].startswith(AUTO) and r.get("adaptive")]
    gravacs = [r for r in res["systems"] if r["id"].startswith(PAPER_GRAVAC)]
    out = []
    for rate, targets in TARGETS.items():
        others: list[tuple[str, str, Optional[float]]] = []
        soonest = best_static(res, vs, rate)
        if soonest is not None:
            others.append(("static", f"`{soonest[1]}` (best static)", soonest[0]))
        others += [("gravac", f"`{g['id']}` (GraVAC, the paper's settings)", _own_run_at(g, rate, vs)) for g in gravacs]
        others.append((BASELINE, f"`{BASELINE}`", 1.0))
        for a in autos:
            mine = _own_run_at(a, rate, vs)
            if mine is None:
                continue
            for kind, name, theirs in others:
                if theirs:
                    q = mine / theirs
                    out.append(f"- {rate}: `{a['id']}` against {name}: {q:.2f}×, target ≥ {targets[kind]:g}×: "
                               f"{verdict(q, targets[kind], floor)}")
    if not out:
        return []
    said = "noise floor unknown" if floor is None else f"noise floor ±{100 * floor:.0f}% in steps to target"
    return ["", f"Issue 42's time targets for `auto` (ratios through {BASELINE}, above 1: `auto` sooner; {said}):",
            *out]
