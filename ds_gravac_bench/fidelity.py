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
link, so its row at a rate is its own cluster run (loss and time) when that run exists.

Systems are ``bench_e2e`` matrix ids (``gv_powersgd_r16``, ``gv_topk_100@cf=50``) or shipped config files
(``cfg:ds_configs/resnet101_recommended.json``), whose non-``"gravac"`` keys must equal the task's dense config.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ds_gravac_bench.fidelity_output import NOISE_CONTROL, markdown, plots
from ds_gravac_bench.fidelity_time import first_eval_reach, first_reach, time_at_rate
from ds_gravac_bench.gravac_label import run_section, system_label
from ds_gravac_bench.report import SKIP_STEPS, read_steps, shown_path, smooth

ROOT = Path(__file__).resolve().parent.parent
TARGET_FRACTION = 0.75          # dense's smoothed loss at 75% of the budget is the target (a task may set another)
LOSS_BOUND = 1.05               # a configuration passes when its final smoothed loss is ≤ dense's + 5% ...
TOP1_POINTS = 0.02              # ... top-1 within 2 points, perplexity within 5% ...
BYTES_BOUND = 0.5               # ... and it sends less than half of dense's bytes


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


# The long regime (docs/BENCHMARKS_LONG.md): ResNet-18 on 100-class synthetic images with heavy noise, a fresh image
# at every draw (400,000 training images > 6,000 steps × 64), warm-up then ×0.1 at 50% and 75% of the budget.
LONG_IMAGES = ("--num-classes", "100", "--synthetic-noise", "12", "--synthetic-size", "400000")
BASELINES = ("ds_dense", "ds_dense_jitter", "ds_fp16", "ds_bf16", "ddp_dense", "ddp_bf16", "ddp_powersgd",
             "ddp_localsgd")
# At two ranks DDP's fp32 all-reduce trains bitwise as DeepSpeed's, and DeepSpeed's bf16 communication as DDP's bf16
# hook (tests/launcher/test_baseline_systems.py): on the long tasks one of each pair is trained on loopback and the
# other takes its loss per step (a run of its own, where one exists, wins); only its cluster step is its own
SAME_CURVE = (("ddp_dense", "ds_dense"), ("ds_bf16", "ddp_bf16"))
# the best static per family (gv_powersgd_r4, gv_topk_100) stand until the tuning sweep picks them; GraVAC with the
# paper's settings (window 500, ε 0.7 and 0.9, Top-k 10…1000); Accordion; auto over each family it drives
PAPER_GRAVAC = ("gv_gravac@gravac.window=500", "gv_gravac@gravac.window=500@gravac.epsilon=0.9")
OURS = ("gv_default", "gv_powersgd_r4", "gv_topk_100", *PAPER_GRAVAC, "gv_accordion_topk", "gv_auto", "gv_auto_qsgd",
        "gv_auto_topk")

LONG_SYSTEMS = tuple(s for s in BASELINES + OURS if s not in dict(SAME_CURVE))


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
                                  same_curve=SAME_CURVE),
    "lstm_long": FidelityTask("lstm", 2000, LONG_SYSTEMS, target_fraction=0.9,
                              runner_extra=("--lstm-size", "medium") + _schedule(2000, 100, 200, 20),
                              same_curve=SAME_CURVE),
    "mlp_screen": FidelityTask("mlp", 3000, LONG_SYSTEMS, lr=0.05, target_fraction=0.9, top1_margin=0.005,
                               runner_extra=LONG_IMAGES + _schedule(3000, 150, 100, 40), same_curve=SAME_CURVE),
}


# ---- run ----------------------------------------------------------------------------------------------------


def run(opts: argparse.Namespace) -> Path:
    """All systems of one task on loopback, through ``bench_e2e`` (same loop, seed, data and base config)."""
    from ds_gravac_bench.e2e import run_matrix

    task = TASKS[opts.task]
    rate = getattr(opts, "rate", "loopback")
    e2e = argparse.Namespace(model=task.model, rate=rate, ranks=2, steps=opts.steps or task.steps,
                             systems=opts.systems or ",".join(task.systems), micro_batch=opts.micro_batch
                             or task.micro_batch, lr=task.lr, epsilon=0.7, theta_min=10.0, ablation=None,
                             tag=getattr(opts, "tag", 3),
                             timeout=opts.timeout, smoke=False, checkpoint_every=getattr(opts, "checkpoint_every", 0),
                             out=opts.out or ROOT / "runs" / (f"fidelity-{opts.task}-seed{opts.seed}"
                                                               + ("" if rate == "loopback" else f"-{rate}")),
                             runner_extra=(*task.runner_extra, "--seed", str(opts.seed)),
                             fidelity={"task": opts.task, "seed": opts.seed, "target_fraction": task.target_fraction,
                                       "top1_margin": task.top1_margin})
    return run_matrix(e2e)


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


def _curve(records: list[dict[str, Any]]) -> dict[str, Any]:
    losses = [float(r["loss"]) for r in records if "loss" in r]
    body = records[SKIP_STEPS:] or records
    times = [float(r["time/step"]) for r in body if r.get("time/step") is not None]
    sent = [float(r["bytes_sent"]) for r in records if r.get("bytes_sent") is not None]
    evals = {k: v for r in records for k, v in r.items() if k.startswith("eval/")}
    top1 = [(int(r.get("step", i + 1)), float(r["eval/top1"])) for i, r in enumerate(records) if "eval/top1" in r]
    return {"loss": losses, "smoothed": smooth(losses), "times": [float(r.get("time/step") or 0) for r in records],
            "median_step": statistics.median(times) if times else None,
            "mean_bytes": statistics.fmean(sent) if sent else None, "eval": evals, "evals": top1}


def _load_dir(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    meta = json.loads((path / "meta.json").read_text())
    curves = {sid: {**_curve(read_steps(path / "systems" / sid / "steps.jsonl")), "family": m.get("family")}
              for sid, m in meta["systems"].items()
              if m.get("returncode", 0) == 0}       # a run that failed or was stopped has no comparable curve
    return meta, curves


SAME_SETTINGS = ("steps", "lr", "micro_batch", "runner_extra")     # what loopback runs merged together must share


def _load_dirs(paths: Sequence[Path], same_settings: bool = False
               ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Optional[dict[str, Any]]]]:
    """Systems of several invocations of one model, first occurrence wins. Their dense reference curves must be
    identical (runs are deterministic on one machine), or the merge would compare against different targets. With
    ``same_settings`` (loopback runs made at different times, e.g. one long system per invocation) they must also
    share budget, lr, micro batch and runner options — seed and task included — whether or not each ran dense."""
    meta: dict[str, Any] = {}
    curves: dict[str, dict[str, Any]] = {}
    sections: dict[str, Optional[dict[str, Any]]] = {}
    reference: Optional[list[float]] = None
    for path in paths:
        m, c = _load_dir(path)
        if meta and m["model"] != meta["model"]:
            raise SystemExit(f"fidelity: {path} trained {m['model']}, not {meta['model']}")
        differ = [k for k in SAME_SETTINGS if meta and same_settings and m.get(k) != meta.get(k)]
        if differ:
            raise SystemExit(f"fidelity: {path} ran with other {', '.join(differ)} than {paths[0]} "
                             f"({', '.join(f'{m.get(k)} vs {meta.get(k)}' for k in differ)}): not one comparison")
        meta = meta or m
        dense = next((c[sid]["loss"] for sid in ("ds_dense", "gv_dense") if sid in c and c[sid]["loss"]), None)
        if dense is not None and reference is not None:
            n = min(len(dense), len(reference))
            if dense[:n] != reference[:n]:
                raise SystemExit(f"fidelity: the dense loss curve of {path} differs from the first directory's; "
                                 "runs from different machines or settings cannot be merged")
        reference = reference or dense
        for sid, curve in c.items():
            if sid not in curves:
                curves[sid], sections[sid] = curve, run_section(path, sid)
    return meta, curves, sections


def build(dirs: Sequence[Path] | Path, clusters: dict[str, Sequence[Path] | Path],
          target_fraction: Optional[float] = None) -> dict[str, Any]:
    """The fidelity table of the runs in ``dirs`` (loss per step), with step times from ``clusters`` (rate →
    bench_e2e directories on the emulated cluster). The loss target's fraction of the budget and the top-1 margin
    come from the task the first directory ran (``meta["fidelity"]``), unless ``target_fraction`` is given."""
    meta, curves, sections = _load_dirs(_paths(dirs), same_settings=True)
    ref_id = "ds_dense" if "ds_dense" in curves else next((s for s in curves if _family(sections[s]) == "dense"),
                                                          None)
    if ref_id is None or not curves[ref_id]["smoothed"]:
        raise SystemExit("fidelity: the run has no dense system (ds_dense or a mode 'dense' config) to compare with")
    ref = curves[ref_id]
    task = meta.get("fidelity") or {}
    fraction = target_fraction or task.get("target_fraction") or TARGET_FRACTION
    target = ref["smoothed"][max(0, int(fraction * len(ref["smoothed"])) - 1)]
    margin, dense_top1 = task.get("top1_margin"), ref["eval"].get("eval/top1")
    top1_target = dense_top1 - margin if margin is not None and dense_top1 is not None else None
    cluster_curves = {rate: _cluster_runs(_paths(path)) for rate, path in clusters.items()}
    if meta.get("N") == 2:
        for sid, source in TASKS[task["task"]].same_curve if task.get("task") in TASKS else ():
            if sid not in curves and source in curves:
                curves[sid], sections[sid] = {**curves[source], "same_curve_as": source}, sections[source]
    rows = []
    for sid, c in curves.items():
        if not c["smoothed"] or sid.startswith("compute_only"):   # one rank alone: only its step time means something
            continue
        n = min(len(c["smoothed"]), len(ref["smoothed"]))
        reach = first_reach(c["smoothed"], target)
        top1_reach = first_eval_reach(c["evals"], top1_target) if top1_target is not None else None
        label = system_label(sid, sections[sid], len(c["smoothed"]))
        if c.get("same_curve_as"):
            label += f" (loss per step: {c['same_curve_as']}'s, bitwise equal at 2 ranks)"
        row = {"id": sid, "label": label, "same_curve_as": c.get("same_curve_as"),
               "family": _family(sections[sid], c.get("family")),
               "section_hash": match_key(sid, sections[sid]), "steps": len(c["smoothed"]),
               "final_loss": c["smoothed"][n - 1], "dense_loss": ref["smoothed"][n - 1],
               "gap": c["smoothed"][n - 1] / ref["smoothed"][n - 1] - 1.0,
               "bytes_ratio": c["mean_bytes"] / ref["mean_bytes"] if c["mean_bytes"] and ref["mean_bytes"] else None,
               "rises": max(c["smoothed"]) > c["smoothed"][0] + 1e-12, "peak": max(c["smoothed"]),
               "steps_to_target": reach, "steps_to_top1": top1_reach, "eval": c["eval"], "rates": {}}
        for rate, cl in cluster_curves.items():
            run = cl.get(sid) or cl.get(match_key(sid, sections[sid]))
            row["rates"][rate] = time_at_rate(run, reach, sections[sid], target, top1_reach, top1_target)
        row["verdict"] = _verdict(row, ref, ref_id)
        rows.append(row)
    for rate in clusters:
        dense = next((r["rates"][rate] for r in rows if r["id"] == ref_id), {})
        for r in rows:
            mine = r["rates"][rate]
            for key, out in (("time_s", "speedup"), ("top1_time_s", "top1_speedup")):
                theirs = dense.get(key)
                mine[out] = theirs / mine[key] if theirs and mine.get(key) else None
    return {"model": meta["model"], "steps": meta["steps"], "reference": ref_id, "target_loss": target,
            "target_fraction": fraction, "top1_target": top1_target, "top1_margin": margin,
            "noise_floor": _noise_floor(rows, ref_id), "failures": _failures(_paths(dirs), curves),
            "env": meta.get("env"), "runs": [shown_path(p) for p in _paths(dirs)],
            "clusters": {k: ", ".join(shown_path(p) for p in _paths(v)) for k, v in clusters.items()}, "systems": rows}


def _noise_floor(rows: list[dict[str, Any]], ref_id: str) -> Optional[dict[str, Any]]:
    """How far dense lands from itself when its gradients are perturbed by 1e-6 (``ds_dense_jitter``): the gap,
    top-1 difference and steps to target a method must beat to mean anything on this seed."""
    control = next((r for r in rows if r["id"] == NOISE_CONTROL), None)
    dense = next(r for r in rows if r["id"] == ref_id)
    if control is None:
        return None
    mine, theirs = control["eval"].get("eval/top1"), dense["eval"].get("eval/top1")
    return {"gap": control["gap"], "top1_diff": mine - theirs if mine is not None and theirs is not None else None,
            "steps_to_target": control["steps_to_target"], "steps_to_top1": control["steps_to_top1"]}


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


def _cluster_runs(paths: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """A rate's cluster runs by id, and by the hash of what they train: a loopback system finds its cluster run
    also when that ran the same section under another id (``cfg:…recommended.json`` against ``gv_topk_10``)."""
    _, curves, sections = _load_dirs(paths)
    by_section = {match_key(sid, sections[sid]): curve for sid, curve in reversed(list(curves.items()))}
    return {**by_section, **curves}


def _paths(value: Sequence[Path] | Path) -> list[Path]:
    return [value] if isinstance(value, Path) else list(value)


def match_key(sid: str, section: Optional[dict[str, Any]]) -> str:
    """What a system trains, independent of its id: the same "gravac" section run under two ids (a matrix id and a
    ``cfg:`` file) gets one hash, so runs of several seeds or a cluster run can be matched on it. Systems without a
    section (DeepSpeed's and DDP's own paths) differ in more than a section, so they keep their id."""
    if section is None:
        return f"id:{sid}"
    return hashlib.sha1(json.dumps(section, sort_keys=True).encode()).hexdigest()[:12]


def _verdict(row: dict[str, Any], ref: dict[str, Any], ref_id: str) -> str:
    """Which of the accuracy bounds a compressed row misses ("ok" when none). Another dense row (a control such
    as ``ds_dense_jitter``) is judged on the accuracy bounds alone, prefixed "control"."""
    if row["id"] == ref_id:
        return "reference"
    mine, theirs = row["eval"], ref["eval"]
    return judged(row["family"], row["final_loss"], row["dense_loss"], mine.get("eval/top1"), theirs.get("eval/top1"),
                  mine.get("eval/ppl"), theirs.get("eval/ppl"), row["bytes_ratio"], row["rises"])


def judged(family: str, loss: float, dense_loss: float, top1: Optional[float], dense_top1: Optional[float],
           ppl: Optional[float], dense_ppl: Optional[float], bytes_ratio: Optional[float], rises: bool,
           prefix: str = "") -> str:
    """:func:`bound_misses` for a non-reference row; a dense one is a control and a baseline (16-bit all-reduce,
    PyTorch's PowerSGD, post-local SGD) is what compression competes with: both are judged on accuracy alone."""
    control = family in ("dense", "baseline")
    verdict = bound_misses(loss, dense_loss, top1, dense_top1, ppl, dense_ppl, None if control else bytes_ratio,
                           rises, prefix)
    return f"{'control' if family == 'dense' else family}: {verdict}" if control else verdict


def bound_misses(loss: float, dense_loss: float, top1: Optional[float], dense_top1: Optional[float],
                 ppl: Optional[float], dense_ppl: Optional[float], bytes_ratio: Optional[float], rises: bool,
                 prefix: str = "") -> str:
    """The accuracy bounds a configuration misses against dense ("ok" when none); ``prefix`` names the
    statistic (e.g. "mean ")."""
    misses = []
    if loss > LOSS_BOUND * dense_loss:
        misses.append(f"{prefix}loss +{100 * (loss / dense_loss - 1):.0f}%")
    if top1 is not None and dense_top1 is not None and top1 < dense_top1 - TOP1_POINTS:
        misses.append(f"{prefix}top-1")
    if ppl is not None and dense_ppl is not None and ppl > LOSS_BOUND * dense_ppl:
        misses.append(f"{prefix}perplexity")
    if bytes_ratio is not None and bytes_ratio >= BYTES_BOUND:
        misses.append("bytes")
    if rises:
        misses.append("loss rises")
    return "ok" if not misses else ", ".join(misses)


def report(dirs: Sequence[Path], clusters: dict[str, list[Path]], out: Path) -> dict[str, Any]:
    res = build(dirs, clusters)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(res, indent=1))
    (out / "fidelity.md").write_text(markdown(res))
    plots(res, out / "plots", _load_dirs(dirs)[1], {k: _cluster_runs(_paths(v)) for k, v in clusters.items()})
    return res


def cluster_arg(value: str) -> tuple[str, list[Path]]:
    """``RATE=DIR[,DIR...]``: bench_e2e outputs on the emulated cluster at one rate."""
    rate, sep, paths = value.partition("=")
    dirs = [Path(p) for p in paths.split(",") if p]
    missing = [str(d) for d in dirs if not (d / "meta.json").exists()]
    if not sep or not rate or not dirs or missing:
        raise argparse.ArgumentTypeError(f"expected RATE=DIR[,DIR...] with each DIR a bench_e2e output (meta.json), "
                                         f"got {value!r}" + (f" ({', '.join(missing)}: no meta.json)" if missing else ""))
    return rate, dirs


def clusters_of(args: Sequence[tuple[str, list[Path]]]) -> dict[str, list[Path]]:
    """Repeated ``--cluster`` arguments of one rate merge."""
    clusters: dict[str, list[Path]] = {}
    for rate, paths in args:
        clusters.setdefault(rate, []).extend(paths)
    return clusters


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train every system of a task (loopback, or the emulated cluster at a rate)")
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
    r.add_argument("--rate", default="loopback",
                   help="loopback (loss per step), or a tc rate of the emulated cluster (1gbit, 100mbit): a "
                        "controller's whole run at that rate, loss and time (docs/BENCHMARKS_LONG.md)")
    r.add_argument("--tag", type=int, default=3, help="the emulated cluster's namespace tag (gvc<T>-…)")
    r.add_argument("--cluster", action="append", type=cluster_arg, default=[], metavar="RATE=DIR")
    p = sub.add_parser("report", help="rebuild fidelity.md, fidelity.json and plots")
    p.add_argument("dirs", nargs="+", help="fidelity/bench_e2e outputs of one model; several are merged when "
                                          "their dense curves are identical")
    p.add_argument("--cluster", action="append", type=cluster_arg, default=[], metavar="RATE=DIR",
                   help="a bench_e2e output on the emulated cluster whose step times give time to target at RATE "
                        "(repeat a rate to merge several)")
    p.add_argument("--out", default=None, help="where fidelity.md/json and plots go (default: the first dir)")
    opts = parser.parse_args(argv)
    dirs = [run(opts)] if opts.cmd == "run" else [Path(d) for d in opts.dirs]
    clusters = clusters_of(opts.cluster)
    res = report(dirs, clusters, Path(getattr(opts, "out", None) or dirs[0]))
    print(markdown(res))


if __name__ == "__main__":
    main()
