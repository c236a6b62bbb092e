"""Time of one plan of the goodput controller's solver on a ResNet101-sized instance (target: < 10 ms).

    python -m ds_gravac_bench.auto_solver_bench --repeats 200

The instance is ResNet101's groups and full ladders (``ds_gravac/adapt/auto/ladder.py``: 23 groups, up to 14
levels each) priced by ``timing.py`` at the given rate; errors are synthetic but shaped like the real ones (a
level's error grows with its compression, dense is error-free), drawn from a seeded generator. Budgets span the
uniform levels' errors, so the solver sees slack, tight and binding budgets. Prints the median and the maximum
milliseconds per plan, how many plans the exact search finished, and one hysteresis decision's time. Nothing is
asserted.
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


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rate", choices=sorted(RATES), default="100mbit")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

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
