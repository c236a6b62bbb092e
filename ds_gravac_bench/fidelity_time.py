"""Steps and time to target for the fidelity benchmark: where a curve first reaches dense's target, and what that
costs in wall time at a link rate (steps to target on loopback × the system's median step on the emulated cluster).

Two targets: dense's smoothed training loss at a fraction of the budget, and (when the task sets a margin) dense's
final held-out top-1 minus that margin, read on the evaluations made every ``--eval-every`` steps.
"""
from __future__ import annotations

from typing import Any, Optional

from ds_gravac_bench.report import SKIP_STEPS
from ds_gravac_bench.step_kinds import kind_prices, priced_time

ONE_STEP = "loopback steps × cluster step"      # a time priced by one median step: rounds of step times may re-price it
PRICED = "priced per branch"   # a controller's time at a rate its whole run was not made at (fidelity_branch_price)


def first_reach(smoothed: list[float], target: float) -> Optional[int]:
    """1-based step at which the smoothed loss first reaches the target."""
    return next((i + 1 for i, s in enumerate(smoothed) if s <= target), None)


def first_eval_reach(evals: list[tuple[int, float]], target: float) -> Optional[int]:
    """The step of the first evaluation whose held-out top-1 reaches the target (evaluations come every
    ``--eval-every`` steps, so this is a multiple of it or the last step)."""
    return next((step for step, top1 in evals if top1 >= target), None)


def adaptive(section: Optional[dict[str, Any]]) -> bool:
    """Whether a section changes its level over training (GraVAC, Accordion, auto), so that no single step time
    stands for its run; read through the config's own defaults, so ``{}`` is whatever mode it means."""
    if section is None:
        return False
    from ds_gravac.config import parse_config
    from ds_gravac.errors import GravacConfigError

    try:
        return parse_config(section).mode != "static"
    except GravacConfigError:            # a section of an older release: its own key, or the old default
        return section.get("mode", "static") != "static"


def quiet_counts(sent: list[Optional[float]], steps_to_target: Optional[int],
                 steps_to_top1: Optional[int]) -> Optional[dict[str, Any]]:
    """How many of a run's steps sent nothing (post-local SGD between two averages): in all, and before each
    target; None when every step sent something."""
    quiet = [b == 0 for b in sent]
    if not any(quiet):
        return None
    return {"all": sum(quiet), "steps": len(quiet),
            "to_target": sum(quiet[:steps_to_target]) if steps_to_target else None,
            "to_top1": sum(quiet[:steps_to_top1]) if steps_to_top1 else None}


def time_at_rate(run: Optional[dict[str, Any]], steps_to_target: Optional[int], section: Optional[dict[str, Any]],
                 target: float, steps_to_top1: Optional[int] = None, top1_target: Optional[float] = None,
                 quiet: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Step time and time to each target of one system at one rate (see ds_gravac_bench.fidelity's docstring). A
    controller that changes levels (GraVAC, Accordion, auto) has no one step time, and GraVAC and auto decide from
    the measured link, so its times come from its own cluster run. ``quiet`` (:func:`quiet_counts` of the loopback
    run) prices the steps that send nothing apart from those that do; a static section's ``warmup_steps`` or a
    system's recorded ``dense_start`` (PyTorch's PowerSGD hook all-reduces fp32 for its first 10 steps) prices
    those dense steps at the cluster run's dense step."""
    if run is None or run["median_step"] is None:
        return {"step_s": None, "time_s": None, "top1_time_s": None, "source": "no cluster run"}
    if adaptive(section):
        reach = first_reach(run["smoothed"], target)
        top1_reach = first_eval_reach(run["evals"], top1_target) if top1_target is not None else None
        return {"step_s": run["median_step"], "time_s": sum(run["times"][:reach]) if reach else None,
                "top1_time_s": sum(run["times"][:top1_reach]) if top1_reach else None, "source": "cluster run"}
    if quiet:
        return time_with_quiet_steps(run, steps_to_target, steps_to_top1, quiet)
    warmup = int((section or {}).get("warmup_steps", 0)) or int(run.get("dense_start") or 0)
    if warmup:
        out = time_with_dense_start(run, steps_to_target, warmup)
        out["top1_time_s"] = time_with_dense_start(run, steps_to_top1, warmup)["time_s"]
        return out
    step_s = run["median_step"]
    return {"step_s": step_s, "time_s": steps_to_target * step_s if steps_to_target else None,
            "top1_time_s": steps_to_top1 * step_s if steps_to_top1 else None,
            "source": ONE_STEP}


def time_with_dense_start(run: dict[str, Any], steps_to_target: Optional[int], warmup: int) -> dict[str, Any]:
    """A static system that starts with ``warmup`` dense steps: those at its cluster run's dense step, the rest at
    its compressed step (both medians past the first ``SKIP_STEPS``). Its cluster run must outlast the warm-up by at
    least ``SKIP_STEPS`` compressed steps, or there is no compressed step to take."""
    times = run["times"]
    prices = kind_prices([*(("dense", t) for t in times[SKIP_STEPS:warmup]),
                          *(("compressed", t) for t in times[warmup + SKIP_STEPS:])])
    if len(prices) < 2:
        return {"step_s": None, "time_s": None,
                "source": f"cluster run of {len(times)} steps too short for {warmup} dense steps"}
    time_s = (priced_time({"dense": min(steps_to_target, warmup), "compressed": max(0, steps_to_target - warmup)},
                          prices) if steps_to_target else None)
    return {"step_s": prices["compressed"]["step_s"], "dense_start_step_s": prices["dense"]["step_s"], "time_s": time_s,
            "source": f"{warmup} dense steps × cluster dense step + the rest × cluster step"}


def time_with_quiet_steps(run: dict[str, Any], steps_to_target: Optional[int], steps_to_top1: Optional[int],
                          quiet: dict[str, Any]) -> dict[str, Any]:
    """A system that sends nothing on some steps (post-local SGD: a parameter average every P steps, local steps
    between): a median over all its cluster steps would price every step as a local one. The loopback run's steps
    that sent something are priced at the cluster run's median such step, its quiet steps at the median quiet step
    (past the first ``SKIP_STEPS``); the cluster run must hold both kinds (at least P + ``SKIP_STEPS`` steps)."""
    body = list(zip(run["times"], run.get("sent") or []))[SKIP_STEPS:]
    prices = kind_prices(("send" if b else "quiet", t) for t, b in body if b is not None)
    if len(prices) < 2:
        return {"step_s": None, "time_s": None, "top1_time_s": None,
                "source": f"cluster run of {len(run['times'])} steps lacks a step that "
                          + ("sends" if "send" not in prices else "sends nothing")}

    def cost(steps: Optional[int], n_quiet: Optional[int]) -> Optional[float]:
        return (priced_time({"send": steps - n_quiet, "quiet": n_quiet}, prices)
                if steps and n_quiet is not None else None)

    return {"step_s": cost(quiet["steps"], quiet["all"]) / quiet["steps"], "send_step_s": prices["send"]["step_s"],
            "quiet_step_s": prices["quiet"]["step_s"], "time_s": cost(steps_to_target, quiet["to_target"]),
            "top1_time_s": cost(steps_to_top1, quiet["to_top1"]),
            "source": "loopback steps that send × cluster sending step + quiet steps × cluster quiet step"}
