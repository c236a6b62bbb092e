"""GraVAC over the uniform rank ladder (``"rank_ladder": "uniform"``) on real gloo ranks.

Every compressed step must send each matrix at the rung's rank (``128 / cf_sent``) capped at the largest rank that
pays by PyTorch's rule, and the classifier (``out``, the last compressed matrix) at least at the compressor's
``rank``. The expected bytes come from the wire formulas of ``lowrank_bytes.step_bytes`` with ranks computed here
from the shapes alone, not from the compressor.
"""
from __future__ import annotations

import pytest

import gravac_jobs as G
import models as M
from harness import run_ranks
from lowrank_bytes import RATE, step_bytes

PIN = 4
# θ 16 (rank 8) → 32 (4) → 64 (2) → 128 (1) under the exponential policy; ε tiny so the candidate is sent
UNIFORM = {"mode": "gravac", "compressor": {"type": "powersgd", "params": {"rank": PIN}}, "rank_ladder": "uniform",
           "theta_min": 16, "epsilon": 0.01, "omega": 0.0, "window": 3, "refresh_steps": 1, "min_sent_steps": 1,
           "warmup_steps": 1, "gain_denominator": "raw", "bucket_cap_mb": 0.05, "min_compress_numel": 100}
STEPS = 14


def _paying(n: int, m: int) -> int:
    return max([0] + [k for k in range(1, min(n, m) + 1) if (n + m) * k * RATE < n * m])


def _expected_rank(name: str, n: int, m: int, cf_sent: float) -> int:
    """Rank of a matrix at a sent level; a rank that does not pay (the matrix travels plain) is ``min(n, m)``."""
    if n * m < UNIFORM["min_compress_numel"]:
        return min(n, m)
    rung, cap = int(round(128 / cf_sent)), _paying(n, m)
    if name == "out.weight":
        return min(max(rung, PIN), cap) if PIN <= cap else min(n, m)
    return min(rung, cap)


def _job(rank: int, world: int) -> dict:
    return {comp: G.run(rank, {**UNIFORM, "compressor": {"type": comp, "params": {"rank": PIN}}}, STEPS)
            for comp in ("powersgd", "acpsgd")}


@pytest.fixture(scope="module")
def runs() -> list:
    return run_ranks(_job, 2)


@pytest.mark.parametrize("comp", ["powersgd", "acpsgd"])
def test_ranks_are_uniform_and_the_classifier_is_pinned(runs: list, comp: str) -> None:
    """ACP-SGD alternates P- and Q-steps over compressed steps, and a Q-step sends at its P-step's level."""
    a, b = runs[0][comp], runs[1][comp]
    assert [(r["branch"], r["cf_sent"]) for r in a["records"]] == [(r["branch"], r["cf_sent"]) for r in b["records"]]
    model = M.make_model(seed=0, width=128, depth=4)
    sent_levels, p_step, level_of_p = set(), True, None
    for r in a["records"]:
        if r["branch"] == "dense":
            assert r["bytes_sent"] == pytest.approx(r["dense_bytes"])
            continue
        sent_levels.add(r["cf_sent"])
        level = r["cf_sent"] if comp == "powersgd" or p_step else level_of_p
        want = step_bytes(model, comp, lambda name, n, m: _expected_rank(name, n, m, level), p_step)
        assert r["bytes_sent"] == pytest.approx(want, abs=0.5), (r["step"], r["cf_sent"])
        level_of_p = r["cf_sent"] if p_step else level_of_p
        p_step = p_step if comp == "powersgd" else not p_step
    assert len(sent_levels) >= 2 and max(sent_levels) >= 64, sent_levels   # a rung (rank ≤ 2) below the pin 4
    for name in a["params"]:
        assert (a["params"][name] == b["params"][name]).all(), name


def test_pinning_changes_the_payload() -> None:
    """The check above can fail: at rung rank 1 the classifier's pinned rank 4 costs more than rank 1 would."""
    model = M.make_model(seed=0, width=128, depth=4)
    pinned = step_bytes(model, "powersgd", lambda name, n, m: _expected_rank(name, n, m, 128.0), True)
    flat = step_bytes(model, "powersgd", lambda name, n, m: min(1, _paying(n, m)) or min(n, m), True)
    assert pinned > flat
