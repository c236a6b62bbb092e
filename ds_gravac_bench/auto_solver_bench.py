"""Time of one plan of the goodput controller's solver on a ResNet101-sized instance (target: < 10 ms).

    python -m ds_gravac_bench.auto_solver_bench --repeats 200
    python -m ds_gravac_bench.auto_solver_bench --controller --repeats 50

The instance is ResNet101's groups and full ladders (``ds_gravac/adapt/auto/ladder.py``: 23 groups, up to 14
levels each) priced by ``timing.py`` at the given rate; errors are synthetic but shaped like the real ones (a
level's error grows with its compression, dense is error-free), drawn from a seeded generator. Budgets span the
uniform levels' errors, so the solver sees slack, tight and binding budgets. Prints the median and the maximum
milliseconds per plan, how many plans the exact search finished, and one hysteresis decision's time. Nothing is
asserted.

``--controller`` times the controller itself on ResNet101's compressed tensors (``mode: "auto"`` over PowerSGD, a
nominal link): ``observe`` of one step's agreed per-group signals, and one decision as every rank makes it
(``before_proposal``, rank 0's ``propose``, ``accept``), each over ``--repeats`` intervals of ``interval_steps``
steps whose signals follow a 1/k spectrum with a per-interval drift. It prints the controller's cost per step
(observe + decision / I) against the static rank-16 steps measured on the emulated cluster (1.03 s at 100 Mbit/s,
0.60 s at 1 Gbit/s; target: below 2% of a step). The per-step signal work inside the synchronizer (the aggregate
gain's group split) is not in it.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Sequence

from ds_gravac.adapt.auto.ladder import DENSE, LOWRANK, QSGD, SPARSE, Level, build_groups, uniform_codes
from ds_gravac.adapt.auto.solver import Hysteresis, solve, totals
from ds_gravac.adapt.auto.timing import Pricer, link_fits

RATES = {"100mbit": 1e8, "1gbit": 1e9}


def synthetic_errors(groups: Sequence, seed: int) -> list[list[float]]:
    """Error ∝ numel × (a family-specific loss per unit of compression) × a per-group noise factor."""
    rng = random.Random(seed)
    out = []
    for g in groups:
        f = rng.uniform(0.2, 5.0)
        row = []
        for lv in g.ladder:
            if lv.family == DENSE:
                row.append(0.0)
            elif lv.family == LOWRANK:
                row.append(g.numel * f / (1.0 + lv.value))
            elif lv.family == QSGD:
                row.append(g.numel * f * 0.02 * 4.0 ** (8 - lv.value) / 4.0)
            else:
                row.append(g.numel * f * (1.0 - 1.0 / lv.value) * 0.5)
        out.append(row)
    return out


CLUSTER_STEP_S = {"100mbit": 1.03, "1gbit": 0.60}     # static PowerSGD rank 16, ResNet101, emulated cluster


def controller_cost(repeats: int, rate: str, tight_slack: float | None = None) -> None:
    """Per-step and per-decision seconds of ``AutoController`` on ResNet101 (see the module docstring);
    ``tight_slack``: every decision tight and bounded by time (``auto.tight_time_slack``, three solves each)."""
    from ds_gravac.adapt.auto.controller import AutoController
    from ds_gravac.adapt.auto.ladder import RANKS
    from ds_gravac.adapt.base import ControllerContext
    from ds_gravac.config import parse_config
    from ds_gravac.sync.aggregate_gain import AggregateSample, GroupSignal
    from ds_gravac.telemetry.stats import AgreedStats
    from runners.models import build_model

    model = build_model("resnet101", num_classes=10)
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.dim() > 1]
    auto = {"link": "nominal", "link_gbit_s": RATES[rate] / 1e9, "dwell": 0}
    if tight_slack is not None:
        auto.update(tight_steps=10 ** 7, tight_time_slack=tight_slack)
    ctl = AutoController(parse_config({"mode": "auto", "compressor": "powersgd", "auto": auto}))
    spec = ctl.signal_groups(shapes)
    ctl.bind(ControllerContext(world_size=2, samples_per_step=32, realize_cf=float, cf_grid=None, multilevel="none",
                               gain_kind="projection", level_kind="rank", compressible=tuple(spec.members)))

    def signals(drift: float) -> tuple:
        out = []
        for g in ctl.groups:
            n, m = g.shape
            spectrum = [1.0 / k for k in range(1, min(n, m) + 1)]
            energy = drift * g.count
            scale = energy / sum(spectrum)
            out.append(GroupSignal(den=energy, applied=energy, prefix=tuple(
                scale * sum(spectrum[:r]) if r <= min(n, m, RANKS[0]) else None for r in RANKS)))
        return tuple(out)

    observe_s, decide_s, step = [], [], 0
    for i in range(repeats):
        sig = signals(1.0 + 0.3 * (i % 3))
        for _ in range(ctl.interval if i else ctl.start):
            stats = AgreedStats(step=step + 1, decision=None, den=0.0, den_raw=0.0, nums=(), t_iter_prev=1.0,
                                t_gain_prev=0.0, values_sent=0.0, bytes_sent=0.0, nonfinite=0.0, world_size=2,
                                aggregate=AggregateSample(step=step, levels=(), den=0.0, nums=(), groups=sig))
            t0 = time.perf_counter()
            ctl.observe(stats)
            observe_s.append(time.perf_counter() - t0)
            step += 1
        t0 = time.perf_counter()
        ctl.before_proposal(step)
        ctl.accept(step, ctl.propose(step, 0.1))
        ctl.decide(step, 0.1)
        decide_s.append(time.perf_counter() - t0)
    obs, dec = statistics.median(observe_s), statistics.median(decide_s)
    per_step = obs + dec / ctl.interval
    print(f"controller, ResNet101 ({len(ctl.groups)} groups, {len(shapes)} matrices), {rate}, I = {ctl.interval}: "
          f"observe median {1e3 * obs:.3f} ms/step, one decision median {1e3 * dec:.2f} ms (max "
          f"{1e3 * max(decide_s):.2f}) over {repeats} decisions; per step {1e3 * per_step:.3f} ms = "
          f"{100 * per_step / CLUSTER_STEP_S[rate]:.3f}% of the {CLUSTER_STEP_S[rate]:.2f} s step (target < 2%); "
          f"one decision / 10 ms = {1e3 * dec / 10:.2f}")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rate", choices=sorted(RATES), default="100mbit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--controller", action="store_true", help="time the controller's observe and decision")
    ap.add_argument("--tight-time-slack", type=float, default=None,
                    help="with --controller: every decision tight, bounded by time with this slack")
    args = ap.parse_args(argv)
    if args.controller:
        controller_cost(args.repeats, args.rate, args.tight_time_slack)
        return

    from runners.models import build_model
    model = build_model("resnet101", num_classes=10)
    groups = build_groups([(n, tuple(p.shape)) for n, p in model.named_parameters()])
    times = Pricer(link_fits(RATES[args.rate], 2e-3, 2), 2).times(groups)
    errors = synthetic_errors(groups, args.seed)
    refs = [uniform_codes(groups, lv) for lv in (Level(LOWRANK, 16.0), Level(LOWRANK, 4.0), Level(QSGD, 8.0),
                                                  Level(SPARSE, 30.0), Level(SPARSE, 100.0))]
    levels = sum(len(g.ladder) for g in groups)
    print(f"ResNet101: {len(groups)} groups, {levels} levels in all, {args.rate}")
    took, cpu, exact = [], [], 0
    for i in range(args.repeats):
        ref = refs[i % len(refs)]
        budget = totals(times, errors, ref)[1] * (0.5 + (i % 7) / 4)
        t0, c0 = time.perf_counter(), time.process_time()
        plan = solve(times, errors, budget, reference=ref)
        took.append(1e3 * (time.perf_counter() - t0))
        cpu.append(1e3 * (time.process_time() - c0))
        exact += plan.exact
    print(f"solve: wall median {statistics.median(took):.2f} ms (max {max(took):.2f}), CPU median "
          f"{statistics.median(cpu):.2f} ms (max {max(cpu):.2f}) over {args.repeats} plans; exact search finished "
          f"in {exact}/{args.repeats}; target < 10 ms: wall median / 10 ms = {statistics.median(took) / 10:.2f}, "
          f"CPU median / 10 ms = {statistics.median(cpu) / 10:.2f}")
    hyst = Hysteresis(groups=len(groups))
    codes, budget = tuple(refs[0]), totals(times, errors, refs[0])[1]
    t0 = time.perf_counter()
    codes, moved = hyst.step(0, codes, times, errors, budget, compute_s=0.36, reference=refs[0])
    print(f"hysteresis decision: {1e3 * (time.perf_counter() - t0):.2f} ms (switched: {moved})")


if __name__ == "__main__":
    main()
