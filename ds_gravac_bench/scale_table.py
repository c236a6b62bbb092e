"""The scale table: system × N, measured against predicted where a run exists, predicted elsewhere.

At a measured N the compute part comes from the same invocation: each system's own compute estimate
(``time/compute_est`` = step − codec − exposed wait), and for DeepSpeed's own path, which leaves none, the median
estimate of the ds_gravac runs. (On a loaded machine a separate compute-only run sees another load: its step is
kept beside, as ``error_compute_only``.) The codec part comes from per-element rates of a reference run (the
smallest measured N with a core per rank, or ``kernels`` from another rate's input); at an oversubscribed N (more
ranks than cores) it is the run's own median instead, labelled: a core shared by two ranks slows it, which no
per-kernel cost predicts. Predicted rows take the reference run's median compute estimate (or ``compute_s``)
and its codec rates.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Mapping, Optional, Sequence

from .scale_laws import Collectives, law_check
from .scale_model import Kernels, kernels_from_record, predict_step

PREDICTED_NS = (8, 16, 64)


def collectives(inp: Mapping[str, Any]) -> tuple[Collectives, dict[int, dict[str, list[tuple[float, float]]]]]:
    probes = {int(n): {op: [(float(x), float(t)) for x, t in rows] for op, rows in ops.items()}
              for n, ops in inp["probes"]["n"].items()}
    return Collectives.from_probes(probes), probes


def reference_n(inp: Mapping[str, Any]) -> int:
    ok = [int(n) for n in inp["measured"] if int(n) <= inp["cores"]]
    if not ok:
        raise ValueError("scale: no measured N with a core per rank to take kernel costs from")
    return min(ok)


def gravac_compute(records: Mapping[str, Any], systems: Sequence[str], sections: Mapping[str, Any]) -> float:
    vals = [records[s]["compute_s"] for s in systems if sections.get(s) is not None and s in records
            and "compute_s" in records[s]]
    if not vals:
        raise ValueError("scale: no ds_gravac system with a compute estimate in the run")
    return statistics.median(vals)


def measured_compute(inp: Mapping[str, Any], n: int, sid: str) -> tuple[float, str]:
    """The compute part of a system at a measured N, from the same invocation: its own compute estimate
    (``time/compute_est``), else (DeepSpeed's own path leaves none) the median estimate of the ds_gravac runs."""
    run = inp["measured"][str(n)]
    own = run["records"].get(sid, {}).get("compute_s")
    if own is not None:
        return float(own), "own compute estimate"
    return gravac_compute(run["records"], inp["systems"], inp["sections"]), "ds_gravac runs' median compute estimate"


def reference_kernels(inp: Mapping[str, Any], compute_s: Optional[float] = None) -> dict[str, Kernels]:
    """Kernels per system from the reference run: compute = the median compute estimate of its ds_gravac runs
    (or ``compute_s``), codec rates from each system's records (DeepSpeed dense: the median stage and
    write-back rates of the others, for its flatten and copy-back)."""
    n = reference_n(inp)
    recs, sections, systems = inp["measured"][str(n)]["records"], inp["sections"], inp["systems"]
    compute = gravac_compute(recs, systems, sections) if compute_s is None else compute_s
    out = {sid: kernels_from_record(recs[sid], inp["workloads"][sid][str(n)], n, compute)
           for sid in systems if sections.get(sid) is not None and sid in recs}
    share = float(inp.get("backward_share", 0.0))        # inputs collected before the overlap model: none
    out = {sid: dataclasses.replace(k, backward_share=share) for sid, k in out.items()}
    copies = [k for k in out.values() if k.stage > 0]
    for sid in systems:
        if sections.get(sid) is None:
            out[sid] = Kernels(compute_s=compute, backward_share=share,
                               stage=statistics.median(k.stage for k in copies) if copies else 0.0,
                               writeback=statistics.median(k.writeback for k in copies) if copies else 0.0)
    return out


def row(inp: Mapping[str, Any], sid: str, n: int, kernels: Kernels, coll: Collectives) -> dict[str, Any]:
    """One table row; measured columns where the input has a run of this system at this N."""
    buckets = inp["workloads"][sid][str(n)]
    pred = predict_step(kernels, buckets, coll, n)
    law = predict_step(kernels, buckets, coll, n, law_only=True)
    out: dict[str, Any] = {"system": sid, "n": n, "status": "predicted", "compute_source": "reference run",
                           "pred": pred, "pred_law_only_step": law["step"]}
    run = inp["measured"].get(str(n))
    rec = run["records"].get(sid) if run else None
    if rec is None:
        return out
    compute, source = measured_compute(inp, n, sid)
    scale = 1.0
    if n > inp["cores"] and pred["codec"] > 0 and "codec_s" in rec:
        # oversubscribed: a shared core slows the codec too; take the run's own
        scale = rec["codec_s"] / pred["codec"]
        source += ", codec of this run (oversubscribed)"
    pred = predict_step(dataclasses.replace(kernels, compute_s=compute), buckets, coll, n, codec_scale=scale)
    only = (run.get("compute_only") or {}).get("step_s")
    with_only = None if only is None else predict_step(dataclasses.replace(kernels, compute_s=only), buckets, coll,
                                                       n, codec_scale=scale)["step"]
    out.update(status="measured", measured=rec, pred=pred, compute_source=source, load=run.get("load"),
               error=pred["step"] / rec["step_s"] - 1.0,
               error_compute_only=None if with_only is None else with_only / rec["step_s"] - 1.0,
               compute_only_s=only)
    return out


def build(inp: Mapping[str, Any], kernels_from: Optional[Mapping[str, Any]] = None,
          predicted_ns: Sequence[int] = PREDICTED_NS, compute_s: Optional[float] = None) -> dict[str, Any]:
    """Every row, the law check of the probes and the all-gather crossovers; ``compute_s`` replaces the
    reference compute of the predicted rows (e.g. a quiet machine's)."""
    coll, probes = collectives(inp)
    source = kernels_from if kernels_from is not None else inp
    kernels = reference_kernels(source, compute_s)
    ns = sorted({int(n) for n in inp["measured"]} | set(predicted_ns))
    rows = [row(inp, sid, n, kernels[sid], coll) for sid in inp["systems"] for n in ns
            if str(n) in inp["workloads"][sid]]
    return {"model": inp["model"], "rate": inp["rate"], "cores": inp["cores"],
            "kernels_from": f"{source['rate']} run, N={reference_n(source)}",
            "reference_compute_s": next(iter(kernels.values())).compute_s,
            "compute_override": compute_s is not None,
            "law_fitted_on_n": list(coll.law_ns),
            "laws": {op: {"alpha_s": law.alpha, "beta_s_per_byte": law.beta,
                          "mbit_s": 8e-6 / law.beta if law.beta > 0 else None} for op, law in coll.laws.items()},
            "law_check": law_check(coll, probes), "rows": rows,
            "crossover": crossovers(inp, kernels, coll)}


def crossovers(inp: Mapping[str, Any], kernels: Mapping[str, Kernels], coll: Collectives) -> list[dict[str, Any]]:
    """For each system that all-gathers above two ranks: the first N (of the workload grid) at which its predicted
    step is no shorter than each other system's (law only; one core per rank)."""
    out = []
    grid = sorted(int(n) for n in next(iter(inp["workloads"].values())))

    def step(sid: str, n: int) -> float:
        return predict_step(kernels[sid], inp["workloads"][sid][str(n)], coll, n, law_only=True)["step"]
    for sid in inp["systems"]:
        above_two = [n for n in grid if n >= 3]
        if not above_two or not any(b["exchange"] == "allgather" for b in inp["workloads"][sid][str(above_two[0])]):
            continue                  # not an all-gather system beyond two ranks (e.g. a quantizer's auto rule)
        for other in inp["systems"]:
            if other == sid:
                continue
            hit = next((n for n in grid if step(sid, n) >= step(other, n)), None)
            out.append({"system": sid, "against": other, "first_n_not_faster": hit,
                        "grid_max": grid[-1],
                        "steps_at_first": (step(sid, hit), step(other, hit)) if hit else None,
                        "falls_back_dense_from_n": next(
                            (n for n in grid if all(b["exchange"] == "dense"
                                                    for b in inp["workloads"][sid][str(n)])), None)})
    return out
