"""Rank-0 metrics for the runners: one record per optimizer step to ``<log-dir>/steps.jsonl`` (always) and to
wandb (unless ``--no-wandb``), a tqdm bar, and the end-of-run summary.

Records are built the same way for every system; ds_gravac's per-step record is merged in when present.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Optional

from ds_gravac.decision import BRANCH_CODES
from ds_gravac.telemetry.sinks import JsonlSink, numeric_metrics

from .auto_heatmap import PREFIX as AUTO_LEVEL

CODEC_TIMES = ("stage_s", "compress_s", "decompress_s", "writeback_s")
LOSS_EWMA_ALPHA = 0.1          # loss smoothing, the same the benchmark report uses for time-to-target


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts (``gravac/t_compression``) become ``a/b`` keys so JSON readers and wandb see scalars."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def sync_fields(records: list[dict[str, Any]], step_time: float) -> dict[str, Any]:
    """The fields ds_gravac adds to a step: its record (``step`` renamed ``sync/step``), the branch as a number,
    and ``time/compute_est`` = step wall time minus codec time and exposed communication wait."""
    if not records:
        return {}
    rec = flatten(records[-1])
    rec["sync/step"] = rec.pop("step", None)
    rec["branch_code"] = BRANCH_CODES.get(str(rec.get("branch")), -1)
    overhead = sum(float(r.get(k, 0.0) or 0.0) for r in records for k in CODEC_TIMES + ("comm_wait_s",))
    rec["time/codec"] = sum(float(r.get(k, 0.0) or 0.0) for r in records for k in CODEC_TIMES)
    rec["time/compute_est"] = step_time - overhead
    return rec


class Summary:
    """What the end-of-run summary needs, accumulated step by step (cheap, rank 0 only)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.losses: list[float] = []
        self.ewma: list[float] = []
        self.step_times: list[float] = []
        self.timeline: list[tuple[str, float, int]] = []
        self.candidates: list[tuple[str, float, int]] = []
        self.bytes_sent = 0.0
        self.dense_bytes = 0.0
        self.bytes_known = False
        self.eval: dict[str, float] = {}
        self.eval_step: Optional[int] = None

    def add(self, record: dict[str, Any]) -> None:
        loss = float(record["loss"])
        self.steps.append(int(record["step"]))
        self.losses.append(loss)
        prev = self.ewma[-1] if self.ewma else loss
        self.ewma.append(prev + LOSS_EWMA_ALPHA * (loss - prev) if math.isfinite(loss) else prev)
        self.step_times.append(float(record["time/step"]))
        if "bytes_sent" in record and "dense_bytes" in record:
            self.bytes_known = True
            self.bytes_sent += float(record["bytes_sent"])
            self.dense_bytes += float(record["dense_bytes"])
        if "branch" in record:
            branch = str(record["branch"])
            if record.get("level_kind") == "rank" and branch != "dense":
                branch += " rank"          # a low-rank compressor's static/Accordion level is a rank, not a CF
            self.timeline.append((branch, float(record.get("cf_sent") or 1.0), int(record["step"])))
        if record.get("mode") == "gravac" and record.get("gravac/theta_c") is not None:
            self.candidates.append(("cand", float(record["gravac/theta_c"]), int(record["step"])))

    def add_eval(self, step: int, metrics: dict[str, float]) -> None:
        self.eval, self.eval_step = dict(metrics), step

    @staticmethod
    def cf_runs(timeline: list[tuple[str, float, int]]) -> list[tuple[str, float, int, int]]:
        """Runs of equal (branch, CF): (branch, cf, first step, last step)."""
        runs: list[tuple[str, float, int, int]] = []
        for branch, cf, step in timeline:
            if runs and runs[-1][0] == branch and runs[-1][1] == cf:
                runs[-1] = (branch, cf, runs[-1][2], step)
            else:
                runs.append((branch, cf, step, step))
        return runs

    def lines(self, header: str, clipping: float, wandb_dir: Optional[str], jsonl: str,
              compare_to: Optional[str] = None) -> list[str]:
        out = [f"== {header} =="]
        if not self.steps:
            return out + ["no optimizer steps were run"]
        times = sorted(self.step_times[1:] or self.step_times)
        out.append(f"steps: {len(self.steps)} (optimizer steps {self.steps[0]}..{self.steps[-1]}), "
                   f"median step {times[len(times) // 2]:.3f} s, total {sum(self.step_times):.1f} s, "
                   f"gradient_clipping {clipping:g}")
        out.append(f"loss (EWMA {LOSS_EWMA_ALPHA}): first {self.ewma[0]:.4f} -> last {self.ewma[-1]:.4f} "
                   f"(raw last {self.losses[-1]:.4f})")
        out.extend(self._timeline_lines())
        if self.bytes_known:
            ratio = self.dense_bytes / self.bytes_sent if self.bytes_sent else float("inf")
            out.append(f"bytes sent {self.bytes_sent / 1e6:.2f} MB vs dense {self.dense_bytes / 1e6:.2f} MB "
                       f"({ratio:.1f}x less)")
        if self.eval:
            vals = ", ".join(f"{k} {v:.4f}" for k, v in self.eval.items())
            out.append(f"eval at step {self.eval_step}: {vals}")
        out.extend(self.reference_lines(compare_to, jsonl))
        out.append(f"steps.jsonl: {jsonl}")
        if wandb_dir:
            out.append(f"wandb run: {wandb_dir} (offline runs upload with: wandb sync {wandb_dir})")
        return out

    def reference_lines(self, compare_to: Optional[str], jsonl: str) -> list[str]:
        """This run's smoothed loss next to another run's (e.g. dense) at the same step, read from its steps.jsonl
        (the same smoothing); nothing when there is no such file or it is this run's own."""
        if not compare_to or not os.path.isfile(compare_to) or os.path.abspath(compare_to) == os.path.abspath(jsonl):
            return []
        ref = Summary()
        with open(compare_to, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line) if line.strip() else {}
                if "loss" in rec and "step" in rec and "time/step" in rec:
                    ref.add(rec)
        step, mine = self.steps[-1], self.ewma[-1]
        if step not in ref.steps:
            return [f"reference {compare_to}: no step {step} there (it ran {len(ref.steps)} steps); no comparison"]
        theirs = ref.ewma[ref.steps.index(step)]
        line = (f"vs reference at step {step}: loss (EWMA) {mine:.4f} here, {theirs:.4f} there "
                f"({100 * (mine / theirs - 1):+.1f}%; {compare_to})")
        return [line]

    def _timeline_lines(self) -> list[str]:
        """Sent CFs (what went on the wire) and, for GraVAC, the candidate CF each window evaluated."""
        out = []
        for label, timeline, show_branch in (("CF timeline (branch@cf or @rank, x steps [first-last])", self.timeline,
                                              True),
                                             ("GraVAC candidates (theta_c x steps [first-last])", self.candidates,
                                              False)):
            runs = self.cf_runs(timeline)
            if runs:
                out.append(f"{label}: " + _join_runs(runs, show_branch))
        return out


def _join_runs(runs: list[tuple[str, float, int, int]], show_branch: bool, limit: int = 12) -> str:
    text = [f"{b.removesuffix(' rank') + '@rank ' if b.endswith(' rank') else (b + '@' if show_branch else '')}"
            f"{cf:g}{'' if b.endswith(' rank') else 'x'} x{last - first + 1} [{first}-{last}]"
            for b, cf, first, last in runs]
    if len(text) > limit:
        text = text[: limit // 2] + [f"... {len(text) - limit} more runs ..."] + text[-limit // 2:]
    return ", ".join(text)


class MetricsLogger:
    """Rank 0 writes, other ranks do nothing; the loop calls it identically on every rank."""

    def __init__(self, args: argparse.Namespace, is_main: bool, ds_config: dict[str, Any], start_step: int,
                 resumed: bool) -> None:
        self.is_main, self.args = is_main, args
        self.summary = Summary()
        self.auto_levels = False
        self.jsonl_path = os.path.join(args.log_dir, "steps.jsonl")
        self._sink: Optional[JsonlSink] = None
        self._events: Optional[JsonlSink] = None
        self.run: Any = None
        self.wandb_dir: Optional[str] = None
        self._bar: Any = None
        if not is_main:
            return
        os.makedirs(args.log_dir, exist_ok=True)
        if not resumed:   # a fresh run never appends to an older run's records
            for name in ("steps.jsonl", "events.jsonl"):
                with open(os.path.join(args.log_dir, name), "w", encoding="utf-8"):
                    pass
        self._sink = JsonlSink(self.jsonl_path)
        self._events = JsonlSink(os.path.join(args.log_dir, "events.jsonl"))
        if not args.no_wandb:
            self.run = self._init_wandb(ds_config)
        if not args.no_progress:
            from tqdm import tqdm

            self._bar = tqdm(total=args.steps, initial=start_step, desc=args.system, unit="step",
                             dynamic_ncols=True, mininterval=1.0)

    def _init_wandb(self, ds_config: dict[str, Any]) -> Any:
        import wandb

        settings = wandb.Settings(x_disable_stats=True, save_code=False)
        config = {"args": {k: v for k, v in vars(self.args).items() if not k.startswith("_")},
                  "deepspeed_config": ds_config}
        run = wandb.init(project=self.args.wandb_project, name=self.args.run_name, dir=os.path.abspath(self.args.log_dir),
                         config=config, settings=settings)
        self.wandb_dir = os.path.dirname(run.dir) if run.dir else None
        return run

    def log_step(self, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self.summary.add(record)
        self.auto_levels = self.auto_levels or any(k.startswith(AUTO_LEVEL) for k in record)
        assert self._sink is not None
        self._sink.write(record)
        if self.run is not None:
            self.run.log(numeric_metrics(record), step=int(record["step"]))
        if self._bar is not None:
            post = {"loss": f"{record['loss']:.3f}"}
            if "cf_sent" in record:
                key = "rank" if record.get("level_kind") == "rank" and record.get("branch") != "dense" else "cf"
                post[key] = f"{record['cf_sent']:g}"
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(1)

    def log_eval(self, step: int, metrics: dict[str, float]) -> None:
        if self.is_main:
            self.summary.add_eval(step, metrics)

    def log_events(self, events: Iterable[dict[str, Any]]) -> None:
        if self._events is not None:
            for event in events:
                self._events.write(flatten(event))

    def info(self, message: str) -> None:
        """A rank-0 line that does not break the progress bar."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def finish(self, header: str, clipping: float) -> None:
        """Close sinks and the wandb run, then print the summary (rank 0)."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.close()
        for sink in (self._sink, self._events):
            if sink is not None:
                sink.close()
        if self.run is not None:
            self.run.finish()
        if self.auto_levels:        # mode auto: the allocation over training beside the records
            from .auto_heatmap import plot, read_records
            plot(read_records(Path(self.jsonl_path)), Path(self.jsonl_path).with_name("auto_levels.png"),
                 title=f"auto: level per group ({self.args.run_name or self.args.system})")
        print("\n".join(self.summary.lines(header, clipping, self.wandb_dir, self.jsonl_path,
                                           getattr(self.args, "compare_to", None))), flush=True)
