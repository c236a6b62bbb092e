"""Fidelity benchmark: does a compressed configuration learn as fast as dense per step, and how much sooner does it
reach dense's accuracy in wall time on the emulated cluster?

    python -m ds_gravac_bench.fidelity run --task resnet101 [--out runs/fidelity-resnet101-seed0]
    python -m ds_gravac_bench.fidelity report runs/fidelity-resnet101-seed0 [more runs of the same model] \\
        --cluster 1gbit=runs/e2e-r101-1g --cluster 100mbit=runs/e2e-r101-100m [--out DIR]

``run`` trains DeepSpeed dense and every selected configuration with the same seed, data order and optimizer on
two ranks of this machine (loopback, no namespaces): the loss per step of a static configuration does not depend
on the link. ``report`` puts each system's loss at equal steps next to dense's, the step at which it first reaches
dense's target (dense's smoothed loss at 75% of the budget), and — from ``bench_e2e`` runs on the emulated cluster —
its time to that target at each link rate: steps to target × the system's median step time there (a static system
with ``warmup_steps`` dense steps: those at its cluster run's dense step, the rest at its compressed step). A
controller (GraVAC, Accordion, auto) changes its level over training, and GraVAC and auto decide from the measured
link, so its row at a rate is its own cluster run (loss and time) when that run exists, with the baseline's step
measured after it in the same invocation (:mod:`ds_gravac_bench.fidelity_reference`).

Systems are ``bench_e2e`` matrix ids (``gv_powersgd_r16``, ``gv_topk_100@cf=50``) or shipped config files
(``cfg:ds_configs/resnet101_recommended.json``), whose non-``"gravac"`` keys must equal the task's dense config.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ds_gravac_bench.fidelity_args import cluster_arg, clusters_of, rate_or_loopback
from ds_gravac_bench.fidelity_judge import judged, rises
from ds_gravac_bench.fidelity_output import NOISE_CONTROL, markdown, plots
from ds_gravac_bench.fidelity_reference import REFERENCE_STEPS, needs_reference, reference_opts, reference_step
from ds_gravac_bench.fidelity_runs import SAME_SETTINGS, as_paths, cluster_runs, load_dirs, match_key
from ds_gravac_bench.fidelity_time import adaptive, first_eval_reach, first_reach, quiet_counts, time_at_rate
from ds_gravac_bench.gravac_label import system_label
from ds_gravac_bench.machine_check import check_before_training
from ds_gravac_bench.report import shown_path
from ds_gravac_bench.systems import jitter_control_of
from ds_gravac_bench.table_targets import held_out_target, loss_target

ROOT = Path(__file__).resolve().parent.parent
TARGET_FRACTION = 0.75          # dense's smoothed loss at 75% of the budget is the target (a task may set another)


@dataclass(frozen=True)
class FidelityTask:
    model: str
    steps: int
    systems: tuple[str, ...]
    micro_batch: Optional[int] = None
    runner_extra: tuple[str, ...] = ()
    target_fraction: float = TARGET_FRACTION   # the loss target: dense's smoothed loss at this fraction of the budget
    top1_margin: Optional[float] = None        # the held-out target: dense's final top-1 minus this (0.005 = 0.5 pt)
    lr: Optional[float] = None                 # default: the model's dense config in ds_configs/
    same_curve: tuple[tuple[str, str], ...] = ()   # (system, source): its loss per step is source's (not trained)
    controllers: tuple[str, ...] = ()          # what ``run --rate`` trains by default: whole runs on the cluster


# The long regime (docs/BENCHMARKS_LONG.md): ResNet-18 on 100-class synthetic images with heavy noise, a fresh image
# at every draw (400,000 training images > 6,000 steps × 64), warm-up then ×0.1 at 50% and 75% of the budget.
LONG_IMAGES = ("--num-classes", "100", "--synthetic-noise", "12", "--synthetic-size", "400000")
BASELINES = ("ds_dense", "ds_dense_jitter", "ds_fp16", "ds_bf16", "ddp_dense", "ddp_bf16", "ddp_powersgd",
             "ddp_localsgd")
# At two ranks DDP's fp32 all-reduce trains bitwise as DeepSpeed's, and DeepSpeed's bf16 communication as DDP's bf16
# hook (tests/launcher/test_baseline_systems.py): on the long tasks one of each pair is trained on loopback and the
# other takes its loss per step (a run of its own, where one exists, wins); only its cluster step is its own
SAME_CURVE = (("ddp_dense", "ds_dense"), ("ds_bf16", "ddp_bf16"))
# the best static per family (gv_powersgd_r4, gv_topk_100) stand until the tuning sweep picks them
OURS_STATIC = ("gv_qsgd8", "gv_powersgd_r4", "gv_topk_100")
# GraVAC with the paper's settings (window 500, ε 0.7 and 0.9, Top-k 10…1000); Accordion; auto over PowerSGD
PAPER_GRAVAC = ("gv_gravac@gravac.window=500", "gv_gravac@gravac.window=500@gravac.epsilon=0.9")
CONTROLLERS = (*PAPER_GRAVAC, "gv_accordion_topk", "gv_auto")
# On the long tasks the controllers train only on the emulated cluster, once per rate (``fidelity run --rate``):
# GraVAC and auto decide from the measured link, so no loopback run is their run at any rate, and Accordion needs
# its whole run there for its time anyway. The screen runs them on loopback too, with auto over each family.
LONG_SYSTEMS = tuple(s for s in BASELINES + OURS_STATIC if s not in dict(SAME_CURVE))
SCREEN_SYSTEMS = LONG_SYSTEMS + CONTROLLERS + ("gv_auto_qsgd", "gv_auto_topk")


def _schedule(steps: int, warmup: int, eval_every: int, eval_batches: int) -> tuple[str, ...]:
    """The long tasks' schedule and evaluations; the last one on the whole held-out split (top-1 on 2,560 images
    has a binomial sd of 0.9 point at 30%, larger than the 0.5-point margin of the held-out target)."""
    return ("--lr-warmup", str(warmup), "--lr-decay-at", "0.5,0.75", "--eval-every", str(eval_every),
            "--eval-batches", str(eval_batches), "--final-eval-batches", "0")


TASKS = {
    "resnet101": FidelityTask("resnet101", 300, ("ds_dense", "gv_powersgd_r16", "gv_powersgd_r4", "gv_acpsgd_r16",
                                                 "gv_topk_10", "gv_topk_100", "gv_dgc_10_nomask")),
    "vgg16": FidelityTask("vgg16", 150, ("ds_dense", "gv_powersgd_r16", "gv_powersgd_r4", "gv_topk_100")),
    "lstm": FidelityTask("lstm", 150, ("ds_dense", "gv_powersgd_r16", "gv_powersgd_r4", "gv_topk_100"),
                         runner_extra=("--lstm-size", "medium")),
    "mlp": FidelityTask("mlp", 300, ("ds_dense", "gv_powersgd_r16", "gv_powersgd_r4", "gv_topk_10", "gv_topk_100",
                                     "gv_dgc_10_nomask")),
    "resnet18_long": FidelityTask("resnet18", 6000, LONG_SYSTEMS, lr=0.02, target_fraction=0.9,
                                  top1_margin=0.005, runner_extra=LONG_IMAGES + _schedule(6000, 300, 200, 40),
                                  same_curve=SAME_CURVE, controllers=CONTROLLERS),
    "lstm_long": FidelityTask("lstm", 2000, LONG_SYSTEMS, target_fraction=0.9,
                              runner_extra=("--lstm-size", "small") + _schedule(2000, 100, 200, 20),
                              same_curve=SAME_CURVE, controllers=CONTROLLERS),
    "mlp_screen": FidelityTask("mlp", 3000, SCREEN_SYSTEMS, lr=0.05, target_fraction=0.9, top1_margin=0.005,
                               runner_extra=LONG_IMAGES + _schedule(3000, 150, 100, 40), same_curve=SAME_CURVE,
                               controllers=CONTROLLERS),
}


# ---- run ----------------------------------------------------------------------------------------------------


def run(opts: argparse.Namespace, after_system: Optional[Callable[[Path, str], None]] = None) -> Path:
    """The systems of one task through ``bench_e2e`` (same loop, seed, data and base config): by default its systems
    on loopback, or its controllers' whole runs on the emulated cluster at ``--rate``; ``after_system`` as
    :func:`ds_gravac_bench.e2e.run_matrix`'s."""
    from ds_gravac_bench.e2e import run_matrix

    task = TASKS[opts.task]
    rate = getattr(opts, "rate", "loopback")
    default = task.systems if rate == "loopback" or not task.controllers else task.controllers
    e2e = argparse.Namespace(model=task.model, rate=rate, ranks=2, steps=opts.steps or task.steps,
                             systems=opts.systems or ",".join(default), micro_batch=opts.micro_batch or task.micro_batch, lr=task.lr, epsilon=0.7, theta_min=10.0, ablation=None,
                             tag=getattr(opts, "tag", 3),
                             timeout=opts.timeout, smoke=False, checkpoint_every=getattr(opts, "checkpoint_every", 0),
                             out=opts.out or ROOT / "runs" / (f"fidelity-{opts.task}-seed{opts.seed}"
                                                               + ("" if rate == "loopback" else f"-{rate}")),
                             runner_extra=(*task.runner_extra, "--seed", str(opts.seed)),
                             fidelity={"task": opts.task, "seed": opts.seed, "target_fraction": task.target_fraction,
                                       "top1_margin": task.top1_margin})
    if rate == "loopback":
        check_before_training(e2e)
    out = run_matrix(e2e, after_system)
    steps = getattr(opts, "reference_steps", 0)
    if rate != "loopback" and steps and needs_reference(e2e.systems):   # the baseline's step beside the others'
        run_matrix(reference_opts(e2e, steps), after_system and (lambda _dir, sid: after_system(out, sid)))
    return out


# ---- report -------------------------------------------------------------------------------------------------


def _family(section: Optional[dict[str, Any]], declared: Optional[str] = None) -> str:
    """``declared`` is the family a bench system states (``"baseline"``: 16-bit all-reduce, PyTorch's PowerSGD,
    post-local SGD); else None is DeepSpeed's or DDP's own dense path; a section's missing keys take the product's
    defaults (``{}`` is the default section, judged by the family of its compressor)."""
    from ds_gravac.compress.registry import lookup
    from ds_gravac.config import parse_config

    if declared:
        return declared
    if section is None:
        return "dense"
    cfg = parse_config(section)
    if cfg.mode == "dense":
        return "dense"
    return compressor_family(lookup(cfg.compressor.type))


def compressor_family(cls: type) -> str:
    """The family a compressor class belongs to, from its class rather than from a list of names (plug-ins
    included): low-rank factors, quantized or half-precision values, else a selection of values."""
    from ds_gravac.compress.base import Kind
    from ds_gravac.compress.cast import HalfCast
    from ds_gravac.compress.lowrank_base import LowRankCompressor

    if issubclass(cls, LowRankCompressor):
        return "low-rank"
    if cls.kind == Kind.QUANTIZED or issubclass(cls, HalfCast):
        return "quantization"
    return "sparsification"                  # selections: all-gathered pairs, or Random-k's shared indices


def build(dirs: Sequence[Path] | Path, clusters: dict[str, Sequence[Path] | Path],
          target_fraction: Optional[float] = None) -> dict[str, Any]:
    """The fidelity table of the runs in ``dirs`` (loss per step), with step times from ``clusters`` (rate →
    bench_e2e directories on the emulated cluster). The loss target's fraction of the budget and the top-1 margin
    come from the task the first directory ran (``meta["fidelity"]``), unless ``target_fraction`` is given. A
    controller trained only on the cluster (no loopback run) gets one row per rate, from its run there."""
    meta, curves, sections = load_dirs(as_paths(dirs), same_settings=True)
    ref_id = "ds_dense" if "ds_dense" in curves else next((s for s in curves if _family(sections[s]) == "dense"),
                                                          None)
    if ref_id is None or not curves[ref_id]["smoothed"]:
        raise SystemExit("fidelity: the run has no dense system (ds_dense or a mode 'dense' config) to compare with")
    ref = curves[ref_id]
    task = meta.get("fidelity") or {}
    fraction = target_fraction or task.get("target_fraction") or TARGET_FRACTION
    target, excursion = loss_target(ref["smoothed"], fraction)
    margin = task.get("top1_margin")
    top1_target = held_out_target(ref["evals"], margin) if margin is not None else None
    cluster_curves = {rate: cluster_runs(as_paths(path)) for rate, path in clusters.items()}
    if meta.get("N") == 2:
        for sid, source in TASKS[task["task"]].same_curve if task.get("task") in TASKS else ():
            if sid not in curves and source in curves:
                curves[sid], sections[sid] = {**curves[source], "same_curve_as": source}, sections[source]
    targets = (ref, target, top1_target)
    rows = []
    for sid, c in curves.items():
        if not c["smoothed"] or sid.startswith("compute_only"):   # one rank alone: only its step time means something
            continue
        row = _row(sid, c, sections[sid], targets)
        timed_as = jitter_control_of(sid) or sid        # a noise control steps as the system it perturbs
        for rate, cl in cluster_curves.items():
            keys = (sid, match_key(sid, sections[sid]), timed_as, match_key(timed_as, sections[sid]))
            run = next((cl[k] for k in keys if k in cl), None)
            row["rates"][rate] = time_at_rate(run, row["steps_to_target"], sections[sid], target,
                                              row["steps_to_top1"], top1_target, row["quiet_steps"])
        row["verdict"] = row_verdict(row, ref, ref_id)
        rows.append(row)
    skipped: list[str] = []
    for rate in clusters:
        rows += _trained_at_rate(rate, as_paths(clusters[rate]), meta, rows, list(clusters), targets, skipped)
    for rate in clusters:
        dense = next((r["rates"][rate] for r in rows if r["id"] == ref_id), {})
        for r in rows:
            mine = r["rates"][rate]
            for key, out in (("time_s", "speedup"), ("top1_time_s", "top1_speedup")):
                theirs = dense.get(key)
                mine[out] = theirs / mine[key] if theirs and mine.get(key) else None
    for r in rows:
        if r.get("trained_at"):
            r["verdict"] = row_verdict(r, ref, ref_id)
    return {"model": meta["model"], "steps": meta["steps"], "reference": ref_id, "target_loss": target,
            "target_fraction": fraction, "target_excursion": excursion, "top1_target": top1_target,
            "top1_margin": margin,
            "noise_floor": noise_floor(rows, ref_id), "failures": _failures(as_paths(dirs), curves),
            "skipped": skipped, "env": meta.get("env"), "runs": [shown_path(p) for p in as_paths(dirs)],
            "clusters": {k: ", ".join(shown_path(p) for p in as_paths(v)) for k, v in clusters.items()}, "systems": rows}


def _row(sid: str, c: dict[str, Any], section: Optional[dict[str, Any]],
         targets: tuple[dict[str, Any], float, Optional[float]]) -> dict[str, Any]:
    """One system's figures against the reference curve: final loss and gap at equal steps, bytes, peak, steps to
    the loss and held-out targets; ``rates`` is filled by the caller."""
    ref, target, top1_target = targets
    n = min(len(c["smoothed"]), len(ref["smoothed"]))
    label = system_label(sid, section, len(c["smoothed"]))
    if c.get("same_curve_as"):
        label += f" (loss per step: {c['same_curve_as']}'s, bitwise equal at 2 ranks)"
    row = {"id": sid, "label": label, "same_curve_as": c.get("same_curve_as"),
           "family": _family(section, c.get("family")), "adaptive": adaptive(section),
           "section_hash": match_key(sid, section), "steps": len(c["smoothed"]),
           "final_loss": c["smoothed"][n - 1], "dense_loss": ref["smoothed"][n - 1],
           "gap": c["smoothed"][n - 1] / ref["smoothed"][n - 1] - 1.0,
           "bytes_ratio": c["mean_bytes"] / ref["mean_bytes"] if c["mean_bytes"] and ref["mean_bytes"] else None,
           "rises": rises(c["smoothed"], ref["smoothed"]), "peak": max(c["smoothed"]),
           "steps_to_target": first_reach(c["smoothed"], target),
           "steps_to_top1": first_eval_reach(c["evals"], top1_target) if top1_target is not None else None,
           "eval": c["eval"], "evals": c["evals"], "rates": {}}
    row["quiet_steps"] = quiet_counts(c["sent"], row["steps_to_target"], row["steps_to_top1"])
    return row


def _trained_at_rate(rate: str, paths: list[Path], meta: dict[str, Any], rows: list[dict[str, Any]],
                     rates: list[str], targets: tuple[dict[str, Any], float, Optional[float]],
                     skipped: list[str]) -> list[dict[str, Any]]:
    """Rows of the controllers that trained only on the emulated cluster at ``rate`` (GraVAC and auto decide from
    the measured link, so their loopback run would not be their run at any rate): loss, held-out metric and time
    all from that run, id ``<system> at <rate>``. A cluster directory whose budget, lr, micro batch or runner
    options (seed included) differ from the loopback runs' is a different comparison: its controllers are listed
    in ``skipped`` with the reason, never compared."""
    have = {r["id"] for r in rows} | {r["section_hash"] for r in rows}
    out = []
    for path in paths:
        cmeta, ccurves, csections = load_dirs([path])
        reference = reference_step(path)
        for sid, c in ccurves.items():
            section = csections[sid]
            if not adaptive(section) or sid in have or match_key(sid, section) in have or not c["smoothed"]:
                continue
            differ = [k for k in SAME_SETTINGS if cmeta.get(k) != meta.get(k)]
            if differ:
                skipped.append(f"{sid} at {rate} ({shown_path(path)}): other {', '.join(differ)} than the loopback "
                               "runs")
                continue
            row = _row(sid, c, section, targets)
            row.update(id=f"{sid} at {rate}", label=f"{row['label']} at {rate}", trained_at=rate, system=sid,
                       section_hash=f"{row['section_hash']}@{rate}")
            row["rates"] = {r: {"step_s": None, "time_s": None, "top1_time_s": None, "source": f"trained at {rate}"}
                            for r in rates}
            row["rates"][rate] = {**time_at_rate(c, row["steps_to_target"], section, targets[1],
                                                 row["steps_to_top1"], targets[2]), "reference": reference}
            have.add(match_key(sid, section))
            out.append(row)
    return out


def noise_floor(rows: list[dict[str, Any]], ref_id: str) -> Optional[dict[str, Any]]:
    """How far dense lands from itself when its gradients are perturbed by 1e-6 (``ds_dense_jitter``): the gap,
    top-1 difference and steps to target a method must beat to mean anything on this seed."""
    control = next((r for r in rows if r["id"] == NOISE_CONTROL), None)
    dense = next(r for r in rows if r["id"] == ref_id)
    if control is None:
        return None
    mine, theirs = control["eval"].get("eval/top1"), dense["eval"].get("eval/top1")
    return {"gap": control["gap"], "top1_diff": mine - theirs if mine is not None and theirs is not None else None,
            "steps_to_target": control["steps_to_target"], "steps_to_top1": control.get("steps_to_top1")}


def _failures(paths: Sequence[Path], curves: dict[str, Any]) -> list[dict[str, Any]]:
    """Systems that did not finish (a baseline that does not run here shows why instead of vanishing): their exit
    code and the last error line of their log."""
    out = []
    for path in paths:
        for sid, m in json.loads((path / "meta.json").read_text())["systems"].items():
            if m.get("returncode", 0) != 0 and sid not in curves and sid not in {f["id"] for f in out}:
                out.append({"id": sid, "returncode": m.get("returncode"), "error": _last_error(path / "systems" / sid)})
    return out


def _last_error(system_dir: Path) -> str:
    log = system_dir / "log.txt"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    hits = [ln.strip() for ln in lines if "Error" in ln or "error:" in ln or "EnforceNotMet" in ln]
    return (hits or lines or ["no log"])[-1][:300]


def row_verdict(row: dict[str, Any], ref: dict[str, Any], ref_id: str) -> str:
    """Which of the accuracy bounds a compressed row misses ("ok" when none). Another dense row (a control such
    as ``ds_dense_jitter``) is judged on the accuracy bounds alone, prefixed "control"."""
    if row["id"] == ref_id:
        return "reference"
    mine, theirs = row["eval"], ref["eval"]
    return judged(row["family"], row["final_loss"], row["dense_loss"], mine.get("eval/top1"), theirs.get("eval/top1"),
                  mine.get("eval/ppl"), theirs.get("eval/ppl"), row["bytes_ratio"], row["rises"])


def report(dirs: Sequence[Path], clusters: dict[str, list[Path]], out: Path) -> dict[str, Any]:
    res = build(dirs, clusters)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(res, indent=1))
    (out / "fidelity.md").write_text(markdown(res))
    plots(res, out / "plots", load_dirs(dirs)[1], {k: cluster_runs(as_paths(v)) for k, v in clusters.items()})
    return res


def add_run_arguments(r: argparse.ArgumentParser) -> None:
    """The options of ``fidelity run`` (``long_keep run`` takes the same)."""
    r.add_argument("--task", choices=sorted(TASKS), default="resnet101")
    r.add_argument("--steps", type=int, default=None, help="default: the task's budget")
    r.add_argument("--systems", default=None, help="comma list of bench_e2e ids and cfg:<file> (default: the task's)")
    r.add_argument("--micro-batch", type=int, default=None)
    r.add_argument("--timeout", type=float, default=7200.0)
    r.add_argument("--seed", type=int, default=0, help="model initialization and data seed of every system "
                   "(another seed gives a second sample of every curve: the run-to-run spread)")
    r.add_argument("--out", default=None, help="default: runs/fidelity-<task>-seed<seed> (git-ignored)")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                   help="checkpoint every K steps; the same command again skips finished systems and resumes the "
                        "others (long tasks: a run outlasts a session)")
    r.add_argument("--rate", default="loopback", type=rate_or_loopback,
                   help="loopback (loss per step), or a tc rate of the emulated cluster (1gbit, 100mbit): a "
                        "controller's whole run at that rate, loss and time (docs/BENCHMARKS_LONG.md)")
    r.add_argument("--reference-steps", type=int, default=REFERENCE_STEPS, metavar="N",
                   help="with --rate: then N steps of ddp_bf16 at the same rate into <out>/reference, the step its "
                        "rows' ratios use (0: none)")
    r.add_argument("--tag", type=int, default=3, help="the emulated cluster's namespace tag (gvc<T>-…)")
    r.add_argument("--cluster", action="append", type=cluster_arg, default=[], metavar="RATE=DIR")


def _has_dense(path: Path) -> bool:
    """Whether a run directory holds a dense system to judge its others against (a cluster run of controllers
    does not: its rows are judged against the seed's loopback run)."""
    _, curves, sections = load_dirs([path])
    return any(sid == "ds_dense" or _family(sections[sid]) == "dense" for sid in curves)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_run_arguments(sub.add_parser("run", help="train every system of a task (loopback, or the emulated cluster "
                                                 "at a rate)"))
    p = sub.add_parser("report", help="rebuild fidelity.md, fidelity.json and plots")
    p.add_argument("dirs", nargs="+", help="fidelity/bench_e2e outputs of one model; several are merged when "
                                          "their dense curves are identical")
    p.add_argument("--cluster", action="append", type=cluster_arg, default=[], metavar="RATE=DIR",
                   help="a bench_e2e output on the emulated cluster whose step times give time to target at RATE "
                        "(repeat a rate to merge several)")
    p.add_argument("--out", default=None, help="where fidelity.md/json and plots go (default: the first dir)")
    opts = parser.parse_args(argv)
    dirs = [run(opts)] if opts.cmd == "run" else [Path(d) for d in opts.dirs]
    if opts.cmd == "run" and opts.rate != "loopback" and not _has_dense(dirs[0]):
        print(f"[fidelity] {shown_path(dirs[0])}: trained at {opts.rate}; judge it against the seed's loopback run: "
              f"python -m ds_gravac_bench.fidelity report <loopback dir> --cluster {opts.rate}={shown_path(dirs[0])}")
        return
    clusters = clusters_of(opts.cluster)
    res = report(dirs, clusters, Path(getattr(opts, "out", None) or dirs[0]))
    print(markdown(res))


if __name__ == "__main__":
    main()
