"""``selection: "cost_model"``: calibration at attach, agreed fits, per-bucket choices, online refits, records.

Lifecycle: :meth:`CostModel.prepare` calibrates once at attach (``cost_model.calibrate``); every finished step
hands its timings to :meth:`CostModel.after_step`, which keeps them as rank-local samples and, on steps that are
multiples of ``cost_model.refit_interval`` (an agreed trigger), refits every primitive from its last samples,
agrees on the new table (MAX on the control channel) and so makes the planner re-plan from the next step on.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ...compress.base import Compressor
from ...config import GravacConfig
from ..collectives import Channels
from ..reduce_rule import ReduceRule
from ..selection import PlannedBuckets, ThresholdSelector
from . import samples as step_samples
from .calibrate import Sample, agree, calibrate
from .fits import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, STAGE, WRITEBACK, ZERO, FitTable, LinearFit, SampleWindow,
                   decode_key, encode_key, least_squares)
from .selector import CostModelSelector, check_priceable, chunk_limit, exchange_candidates

if TYPE_CHECKING:
    from ..buckets import BucketPlan
    from ..running_step import RunningStep

MIN_SPAN = 4.0      # a window whose sizes span less than this borrows the calibration points


class CostModel(CostModelSelector):
    """The cost-model selector plus its measurements (see the module docstring)."""

    def __init__(self, config: GravacConfig, compressor: Compressor, rule: ReduceRule, world_size: int,
                 channels: Channels, fallback: ThresholdSelector) -> None:
        candidates = exchange_candidates(config.quantized_exchange, compressor)
        check_priceable(compressor, candidates)
        super().__init__(config.cost_model.margin, candidates, rule, world_size, fallback,
                         chunk_limit(config, compressor))
        self.config, self.comp, self.channels = config, compressor, channels
        self.windows: dict[str, SampleWindow] = {}
        self.calibration: dict[str, list[Sample]] = {}
        self.names: set[str] = set(self.collectives()) | {STAGE, WRITEBACK}
        self.calibration_s = 0.0

    def collectives(self) -> tuple[str, ...]:
        """The collectives the candidate patterns use (the dense all-reduce always)."""
        kinds = [ALL_REDUCE]
        if any(c in ("allgather", "casync_ps") for c in self.candidates):
            kinds.append(ALL_GATHER)
        if "casync_ps" in self.candidates:
            kinds.append(ALL_TO_ALL)
        return tuple(kinds)

    # ---- attach -------------------------------------------------------------------------------------------
    def prepare(self, planner: PlannedBuckets) -> None:
        """Calibrate (collective), unless disabled or nothing is compressible."""
        largest = max((b.numel for b in planner.plan.buckets if b.compressible), default=0)
        if not self.config.cost_model.calibrate or largest == 0 or self.fits is not None:
            return
        t0 = time.perf_counter()
        table, self.calibration = calibrate(self.config, self.comp, self.collectives(), largest, self.channels)
        self.names |= set(table.names())
        self.set_fits(table)
        self.calibration_s = time.perf_counter() - t0

    # ---- every step ---------------------------------------------------------------------------------------
    def after_step(self, run: "RunningStep", planner: PlannedBuckets, nonfinite: bool) -> dict[str, Any]:
        """Keep the step's samples, refit on agreed steps, and return the record's cost-model keys."""
        codecs = planner.codecs
        for b, action in enumerate(run.plan.actions):        # levels sent are agreed (the plan is)
            if action.compressed and b in codecs:
                for p in codecs[b].plans(action.levels):
                    self.names |= {encode_key(p.level), decode_key(p.level)}
        if not nonfinite:
            for name, (calls, x, t) in (*step_samples.codec_samples(run, codecs, self.candidates[0],
                                                                     self.world_size),
                                        *step_samples.collective_samples(run.exchanges)):
                self.windows.setdefault(name, SampleWindow()).add(x, t, calls)
        rec = self.record(run, planner.plan)
        interval = self.config.cost_model.refit_interval
        if interval and run.plan.step > 0 and run.plan.step % interval == 0:
            self.refit()
            rec["cost_model/refit"] = True
        return rec

    def refit(self) -> None:
        """Least squares over each primitive's window (plus the calibration points when its sizes span less
        than 4×), then the MAX agreement. A primitive without samples keeps its agreed fit."""
        local: dict[str, LinearFit] = {}
        for name in sorted(self.names):
            window, cal = self.windows.get(name), self.calibration.get(name, [])
            if window is not None and len(window):
                local[name] = window.fit(cal if window.span() < MIN_SPAN else ())
            elif cal:
                local[name] = least_squares(cal)
            else:
                local[name] = self.fits.get(name) if self.fits is not None else ZERO
        self.set_fits(agree(FitTable(local), self.channels))

    def record(self, run: "RunningStep", plan: "BucketPlan") -> dict[str, Any]:
        """Per compressible bucket: choice, exchange, pipeline chunks, predicted dense and compressed seconds,
        measured seconds (launch to the return of its last wait)."""
        rows, predicted, measured = [], 0.0, 0.0
        for bucket in plan.buckets:
            b = bucket.index
            if not bucket.compressible:
                continue
            action, ex = run.plan.actions[b], run.exchanges.get(b)
            last = ex.works[-1] if ex is not None and ex.works else None
            took = (last.finish_t - run.launch_t[b] if last is not None and last.finish_t is not None
                and b in run.launch_t else math.nan)
            pd, pc = action.predicted if action.predicted is not None else (math.nan, math.nan)
            rows.append({"bucket": b, "numel": bucket.numel, "choice": "compress" if action.compressed else "dense",
                         "exchange": (action.exchange or self.candidates[0]) if action.compressed else "dense",
                         "chunks": action.chunks if action.compressed else 1,
                         "pred_dense_s": pd, "pred_compressed_s": pc, "measured_s": took})
            chosen = pc if action.compressed else pd
            predicted += chosen if math.isfinite(chosen) else 0.0
            measured += took if math.isfinite(took) else 0.0
        return {"cost_model/fits_version": self.version, "cost_model/calibration_s": self.calibration_s,
                "cost_model/predicted_s": predicted, "cost_model/measured_s": measured,
                "cost_model/compressed_buckets": sum(r["choice"] == "compress" for r in rows),
                "cost_model/buckets": rows}
