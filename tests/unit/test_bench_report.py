"""The e2e report's comparisons do not depend on the order the systems ran in."""
from __future__ import annotations

import pytest

from ds_gravac_bench.report import add_comparisons, system_summary


def _records(step_s: float, losses: list[float]) -> list[dict]:
    return [{"time/step": step_s, "loss": loss} for loss in losses]


@pytest.mark.parametrize("dense_first", [True, False])
def test_speedups_are_computed_whatever_the_run_order(dense_first: bool) -> None:
    losses = [8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    dense = system_summary("ds_dense", _records(2.0, losses), {})
    fast = system_summary("gv_topk_100", _records(0.5, losses), {})     # same loss per step, 4x cheaper steps
    slow = system_summary("gv_topk_10", _records(1.0, losses), {})
    systems = [dense, slow, fast] if dense_first else [fast, slow, dense]
    target = add_comparisons(systems, None)
    assert target == dense["smoothed"][5]
    assert dense["speedup_vs_ds_dense"] == 1.0
    assert fast["speedup_vs_ds_dense"] == pytest.approx(4.0) and slow["speedup_vs_ds_dense"] == pytest.approx(2.0)
    assert fast["speedup_vs_topk10"] == pytest.approx(2.0) and dense["speedup_vs_topk10"] == pytest.approx(0.5)
