"""The long regime's leading table (docs/BENCHMARKS.md): per system and rate, the mean time to target and its ratio
against DDP with PyTorch's bf16 hook — what a user turns on first to send less — beside the final held-out
metric as mean ± spread over the paired seeds, bytes, and the bounds.

Written by ``fidelity_seeds`` as ``lead.md`` from a :func:`ds_gravac_bench.fidelity_seeds.combine` result. The
time is to the held-out target where the task sets one (top-1: dense's final minus its margin), else to the loss
target; a ratio above 1 is sooner than DDP + bf16. A system that missed the target on some seed has no mean time
and no ratio ("–"), and a row of a controller trained at one rate has figures at that rate only.

A controller's own cluster run that measured the baseline's step beside it (:mod:`ds_gravac_bench.fidelity_reference`)
is divided by the baseline's mean steps to target × that step: both sides of the ratio from one invocation. So is
its run priced per branch at a rate it was not made at (:mod:`ds_gravac_bench.fidelity_branch_price` ``--save``),
against the baseline's step measured beside the segments.

With step times measured in rounds (``fidelity_seeds --rounds RATE=FILE``), a static row's cell also gives the
ratio paired within each round — both systems' median step of that round, each times its mean steps to target —
as min–max: the step-time noise floor beside the ratio; a range that holds 1 is no difference.

Below it, per rate, where post-local SGD (its best period there) is sooner than each compressed system and where it
is not, judged against the noise floor in steps to target (the jitter control's mean relative difference to dense):
a difference inside it is "no difference". A controller's own run with the baseline beside it is compared through the
two ratios against the baseline, never through seconds of two invocations.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional

from ds_gravac_bench.fidelity_output import NOISE_CONTROL
from ds_gravac_bench.systems import jitter_control_of

BASELINE = "ddp_bf16"          # DDP + torch's bf16_compress_hook
LOCAL_SGD = "ddp_localsgd"     # PyTorch's post-local SGD, one row per period (``ddp_localsgd@period=P``)
COMPRESSED = ("sparsification", "low-rank", "quantization")


def judged_on_held_out(res: dict[str, Any]) -> bool:
    """Every seed's dense set a held-out target (``combine``'s flag, as the sweep reads it): times are to it. A final
    top-1 alone is no target: without interim evaluations there are no steps to one."""
    return bool(res.get("held_out_target"))


def times_to_target(row: dict[str, Any], held_out: bool) -> dict[str, Optional[float]]:
    """Rate → a combined row's mean time to the target the task is judged on."""
    return row.get("top1_time_s", {}) if held_out else row.get("time_s", {})


def ratios(res: dict[str, Any]) -> dict[str, dict[str, Optional[float]]]:
    """System id → rate → the baseline's mean time to target over the system's (None where either is missing). A
    row that carries the baseline's step measured beside its own run (``reference_step_s``) is divided by the
    baseline's mean steps to target × that step, not by the baseline's kept time."""
    held_out = judged_on_held_out(res)
    base = next((r for r in res["systems"] if r["id"] == BASELINE), None)
    base_t = times_to_target(base, held_out) if base else {}
    base_steps = mean_steps_to_target(base, held_out) if base else None
    out = {}
    for r in res["systems"]:
        beside = r.get("reference_step_s") or {}
        theirs = {rate: base_steps * beside[rate] if rate in beside and base_steps else base_t.get(rate)
                  for rate in times_to_target(r, held_out)}
        out[r["id"]] = {rate: theirs[rate] / t if t and theirs[rate] else None
                        for rate, t in times_to_target(r, held_out).items()}
    return out


def mean_steps_to_target(row: dict[str, Any], held_out: bool) -> Optional[float]:
    """A combined row's mean steps to the target the task is judged on; None when a seed never reaches it."""
    steps = row.get("steps_to_top1" if held_out else "steps_to_target") or []
    return sum(steps) / len(steps) if steps and all(s for s in steps) else None


def round_ratios(res: dict[str, Any]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """System id → rate → (min, median, max) over the rounds of the baseline's time to target over the system's,
    each round's median steps times the mean steps to target. Only rows priced by one cluster step at that rate
    (not a controller's own run, nor post-local SGD's or a dense start's mixed steps)."""
    held_out = judged_on_held_out(res)
    base = next((r for r in res["systems"] if r["id"] == BASELINE), None)
    base_steps = mean_steps_to_target(base, held_out) if base else None
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for rate, at in (res.get("rounds") or {}).items():
        base_rounds = at["systems"].get(BASELINE)
        if not base_steps or not base_rounds:
            continue
        for r in res["systems"]:
            mine, steps = at["systems"].get(r["id"]), mean_steps_to_target(r, held_out)
            if r["id"] == BASELINE or not mine or not steps or not r.get("one_step", {}).get(rate):
                continue
            xs = [base_steps * b / (steps * m) for b, m in zip(base_rounds, mine)]
            out.setdefault(r["id"], {})[rate] = (min(xs), statistics.median(xs), max(xs))
    return out


def _metric(row: dict[str, Any]) -> str:
    spread = row.get("top1_spread")
    if spread:
        return f"{100 * spread['mean']:.2f} ± {100 * spread['sd']:.2f}"
    ppl = row.get("ppl_spread")
    if ppl and ppl["n"] > 1:
        return f"ppl {ppl['mean']:.1f} ± {ppl['sd']:.1f}"
    return "–" if row.get("ppl") is None else f"ppl {row['ppl']:.1f}"


def _cell(t: Optional[float], x: Optional[float], paired: Optional[tuple[float, float, float]] = None,
          beside: Optional[float] = None, priced: bool = False) -> str:
    if t is None:
        return "–"
    if not x:
        return f"{t:.0f} s"
    rounds = f"; rounds {paired[0]:.2f}–{paired[2]:.2f}×" if paired else ""
    how = "priced per branch, " if priced else ""
    step = f"; {how}{BASELINE} beside it {beside:.3f} s" if beside else ""
    return f"{t:.0f} s ({x:.2f}×{rounds}{step})"


def lead_markdown(res: dict[str, Any]) -> str:
    held_out = judged_on_held_out(res)
    rates = sorted({rate for r in res["systems"] for rate in times_to_target(r, held_out)})
    vs, paired = ratios(res), round_ratios(res)
    floor = next((r for r in res["systems"] if r["id"] == NOISE_CONTROL), None)
    target = "held-out target" if held_out else "loss target"
    n = len(res["seeds"])
    ppl = "final held-out perplexity (mean ± sd)" if n > 1 else "final held-out perplexity (mean)"
    top1 = any(r.get("top1_spread") for r in res["systems"])   # the metric shown; the target is ``held_out``
    metric = "final held-out top-1 % (mean ± sd)" if top1 else ppl
    head = ["system", "family"] + [f"{rate}: time to {target} (× {BASELINE})" for rate in rates]
    head += [metric, "top-1 − dense, points" if top1 else "gap of the means", "bytes / dense", "bounds"]
    lines = [f"# {res['model']}, {res['steps']} steps, 2 ranks, {n} paired seed{'s' * (n != 1)}", "",
             f"Ratios: {BASELINE}'s mean time to the {target} over the system's (above 1: sooner); \"{BASELINE} "
             f"beside it\": a controller's own run, against {BASELINE}'s steps × its step measured in that invocation."
             + (f" Noise floor ({NOISE_CONTROL}): top-1 − dense {_pm(floor.get('top1_diff'))} points."
                if floor and floor.get("top1_diff") else ""), "",
             *_rounds_note(res), *floor_note(res), "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res["systems"]:
        family = r["family"] + (" (noise control)" if jitter_control_of(r["id"]) else "")
        cells = [r["id"], family] + [_cell(times_to_target(r, held_out).get(rate), vs[r["id"]].get(rate),
                                                paired.get(r["id"], {}).get(rate),
                                                (r.get("reference_step_s") or {}).get(rate),
                                                rate in r.get("priced_at", ())) for rate in rates]
        diff = _pm(r.get("top1_diff")) if top1 else f"{100 * r['gap']:+.1f}%"
        bytes_cell = "–" if r.get("bytes_ratio") is None else f"{r['bytes_ratio']:.3f}"
        lines.append("| " + " | ".join(cells + [_metric(r), diff, bytes_cell, r["verdict"]]) + " |")
    return "\n".join(lines + controller_lines(res, vs) + local_sgd_lines(res, vs)) + "\n"


def _rounds_note(res: dict[str, Any]) -> list[str]:
    rounds = res.get("rounds") or {}
    if not rounds:
        return []
    said = ", ".join(f"{rate}: {at['rounds']} rounds (`{at['file']}`)" for rate, at in sorted(rounds.items()))
    return [f"Rounds of step times ({said}): a static row's ratio paired per round, min–max; a range that holds 1 "
            "is no difference.", ""]


def steps_floor(res: dict[str, Any]) -> Optional[float]:
    """The noise floor in steps to target: the jitter control's mean |steps / dense's steps − 1| over the seeds
    where both reached it (None without the control)."""
    held_out = judged_on_held_out(res)
    mine, dense = ("steps_to_top1", "dense_steps_to_top1") if held_out else ("steps_to_target", "dense_steps_to_target")
    floor = next((r for r in res["systems"] if r["id"] == NOISE_CONTROL), None)
    pairs = [(a, b) for a, b in zip(floor.get(mine) or [], floor.get(dense) or []) if a and b] if floor else []
    return _mean_rel(pairs) if pairs else None


def _mean_rel(pairs: list[tuple[float, float]]) -> float:
    """The mean |a / b − 1| of (steps, reference steps) pairs: a floor in steps to target."""
    return sum(abs(a / b - 1) for a, b in pairs) / len(pairs)


def beyond(x: float, floor: float) -> int:
    """+1 when ratio ``x`` lies above the floor, −1 below it, 0 inside it (no difference)."""
    return 1 if x > 1 + floor else -1 if x < 1 / (1 + floor) else 0


def control_floors(res: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """Noise control id ``X@jitter=…`` → (X, the mean |its steps / X's − 1| over the seeds where both reached the
    target): how far a perturbation of ten ulps moves X itself, which on a compressed run is far more than on dense."""
    held_out = judged_on_held_out(res)
    key = "steps_to_top1" if held_out else "steps_to_target"
    rows = {r["id"]: r for r in res["systems"]}
    out = {}
    for sid, r in rows.items():
        base = rows.get(jitter_control_of(sid) or "")
        if base is None:
            continue
        pairs = [(a, b) for a, b in zip(r.get(key) or [], base.get(key) or []) if a and b]
        if pairs:
            out[sid] = (base["id"], _mean_rel(pairs))
    return out


def comparison_floor(res: dict[str, Any]) -> Optional[float]:
    """The floor two systems' times to target are judged against: the largest of dense's (the jitter control) and
    every compressed system's own (:func:`control_floors`, applied to every compressed row alike)."""
    floors = [f for f in (steps_floor(res), *(f for _, f in control_floors(res).values())) if f is not None]
    return max(floors) if floors else None


def floor_note(res: dict[str, Any]) -> list[str]:
    """The noise floors in steps to target, one sentence (empty without any control)."""
    dense, controls = steps_floor(res), control_floors(res)
    parts = ([f"dense ±{100 * dense:.0f}% (`{NOISE_CONTROL}`)"] if dense is not None else []) + [
        f"`{base}` ±{100 * f:.0f}% (`{sid}`)" for sid, (base, f) in controls.items()]
    if not parts:
        return []
    return [f"Noise floor in steps to the target (a run with its averaged gradients × (1 + 1e-6·N(0,1)) against "
            f"the same run without): {'; '.join(parts)}. Two systems' times are judged against the largest.", ""]


def timed_here(row: dict[str, Any], rate: str) -> bool:
    """The row's time at ``rate`` is its own: a static row priced there, a controller trained there, or its run at
    another rate priced per branch there (a controller's run at another rate has no time here otherwise, and
    saying "never reached" of it would be wrong)."""
    return row.get("trained_at") in (None, rate) or rate in row.get("priced_at", ())


def _compared(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Compressed rows that are systems, not noise controls."""
    return [r for r in res["systems"] if r["family"] in COMPRESSED and jitter_control_of(r["id"]) is None]


def controller_lines(res: dict[str, Any], vs: dict[str, dict[str, Optional[float]]]) -> list[str]:
    """Per rate, every controller against the best static compressed row within the bounds (its ratio against the
    baseline over theirs, so a controller's own run compares through the ratios), judged against
    :func:`comparison_floor`: the issue's "× the best static" target."""
    held_out, floor = judged_on_held_out(res), comparison_floor(res)
    controllers = [r for r in _compared(res) if r.get("adaptive")]
    out = []
    for rate in sorted({rate for r in controllers for rate in times_to_target(r, held_out)}):
        soonest = best_static(res, vs, rate)
        if soonest is None:
            continue
        best_x, best = soonest
        for r in controllers:
            if rate in times_to_target(r, held_out) and timed_here(r, rate):
                x = vs.get(r["id"], {}).get(rate)
                out.append(f"- {rate}: `{r['id']}` " + (f"{x:.2f}× {BASELINE}" if x else "never reached the target")
                           + f" against `{best}` {best_x:.2f}× (best static): {_judge(x, best_x, floor)}")
    if not out:
        return []
    said = "noise floor unknown" if floor is None else f"noise floor ±{100 * floor:.0f}%"
    return ["", f"Controllers against the best static setting within the bounds ({said}):", *out]


def best_static(res: dict[str, Any], vs: dict[str, dict[str, Optional[float]]],
                rate: str) -> Optional[tuple[float, str]]:
    """(ratio against the baseline, id) of the soonest static compressed row within the bounds at ``rate``."""
    static = [r for r in _compared(res) if not r.get("adaptive") and r["verdict"].endswith("ok")]
    timed = [(x, r["id"]) for r in static if (x := vs.get(r["id"], {}).get(rate))]
    return max(timed) if timed else None


def _judge(x: Optional[float], best_x: float, floor: Optional[float]) -> str:
    """A controller's ratio against the best static's, both against the baseline."""
    if not x:
        return "slower"
    if floor is None:
        return f"{x / best_x:.2f}×, undecided without a floor"
    side = beyond(x / best_x, floor)
    if side:
        return f"{x / best_x:.2f}× sooner" if side > 0 else f"{best_x / x:.2f}× slower"
    return f"{x / best_x:.2f}×: no difference"


def local_sgd_lines(res: dict[str, Any], vs: dict[str, dict[str, Optional[float]]]) -> list[str]:
    """Per rate, post-local SGD's best period (within the accuracy bounds) against every compressed row; ``vs`` is
    :func:`ratios` of ``res``."""
    held_out = judged_on_held_out(res)
    local = [r for r in res["systems"] if r["id"].startswith(LOCAL_SGD) and r["verdict"].endswith("ok")]
    compressed = _compared(res)
    if not local or not compressed:
        return []
    floor = comparison_floor(res)
    said = "noise floor unknown: no jitter control" if floor is None else f"noise floor ±{100 * floor:.0f}%"
    out = ["", "Post-local SGD against compression (time to the " + ("held-out" if held_out else "loss") + " target; "
           + said + "):"]
    for rate in sorted({rate for r in local for rate in times_to_target(r, held_out)}):
        timed = [(t, r["id"]) for r in local if (t := times_to_target(r, held_out).get(rate))]
        if not timed:
            steps = "steps_to_top1" if held_out else "steps_to_target"
            reached = any(s for r in local for s in r.get(steps) or [])
            out.append(f"- {rate}: post-local SGD " + ("reached the target but has no step time at this rate"
                                                         if reached else "never reached the target"))
            continue
        best_t, best = min(timed)
        verdicts = [f"`{r['id']}` {_against(best_t, times_to_target(r, held_out).get(rate), floor, _beside(vs, r, best, rate))}"
                    for r in compressed
                    if rate in times_to_target(r, held_out) and timed_here(r, rate)]
        out.append(f"- {rate}: `{best}` ({best_t:.0f} s) against " + "; ".join(verdicts))
    return out


def _beside(vs: dict[str, dict[str, Optional[float]]], row: dict[str, Any], local: str,
            rate: str) -> Optional[tuple[float, float]]:
    """(post-local SGD's ratio, the row's ratio) against the baseline when the row's ratio uses the baseline's step
    measured beside its own run: its seconds come from another invocation than post-local SGD's, and a step moves
    15–27% between invocations, so only the two ratios compare. None otherwise (both priced in one invocation)."""
    if rate not in (row.get("reference_step_s") or {}):
        return None
    mine, theirs = vs.get(local, {}).get(rate), vs.get(row["id"], {}).get(rate)
    return (mine, theirs) if mine and theirs else None


def _against(local_t: float, t: Optional[float], floor: Optional[float],
             beside: Optional[tuple[float, float]] = None) -> str:
    if t is None:
        return "(never reached the target): post-local SGD sooner"
    x = beside[0] / beside[1] if beside else t / local_t
    said = f"{t:.0f} s, {beside[1]:.2f}× {BASELINE} beside it against {beside[0]:.2f}×" if beside else f"{t:.0f} s"
    if floor is None:
        return f"({said}, {x:.2f}× post-local SGD's time): undecided without a floor"
    side = beyond(x, floor)
    if side:
        return f"({said}): post-local SGD {x:.2f}× sooner" if side > 0 else f"({said}): compression {1 / x:.2f}× sooner"
    return f"({said}): no difference"


def _pm(spread: Optional[dict[str, float]]) -> str:
    """Points as mean ± sd; a mean that rounds to zero prints +0.00, never -0.00."""
    return "–" if not spread else f"{round(100 * spread['mean'], 2) + 0.0:+.2f} ± {100 * spread['sd']:.2f}"
