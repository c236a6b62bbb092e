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


def test_the_report_files_hold_no_absolute_path(tmp_path) -> None:
    """results.json, results.md and the step table are kept and shared: nothing in them names this machine's paths."""
    import json

    from ds_gravac_bench.report import report

    out = tmp_path / "e2e"
    for sid, step_s in (("ds_dense", 2.0), ("gv_topk_100", 0.5)):
        (out / "systems" / sid).mkdir(parents=True)
        (out / "systems" / sid / "steps.jsonl").write_text(
            "".join(json.dumps({**r, "bytes_sent": 1e6}) + "\n" for r in _records(step_s, [3.0, 2.0, 1.5, 1.0])))
    meta = {"env": {"git_commit": "0" * 40}, "model": "mlp", "N": 2, "steps": 4,
            "network": {"rate": "loopback", "delay": "0"}, "systems": {"ds_dense": {}, "gv_topk_100": {}}}
    (out / "meta.json").write_text(json.dumps(meta))
    report(out)
    for name in ("results.json", "results.md", "steps_loss_time.csv"):
        assert str(tmp_path) not in (out / name).read_text(), name
