"""A GraVAC row whose first window never ended is labelled static in the e2e and fidelity reports."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity_output import markdown as fidelity_markdown
from ds_gravac_bench.gravac_label import system_label, window_never_reached
from ds_gravac_bench.report import report

SHORT = {"mode": "gravac", "compressor": "topk", "warmup_steps": 2, "window": 4, "refresh_steps": 1}


@pytest.mark.parametrize("steps, never", [(5, True), (6, True), (7, False)])
def test_the_first_boundary_is_the_step_after_warmup_plus_window(steps: int, never: bool) -> None:
    assert window_never_reached(SHORT, steps) is never


def test_defaults_and_other_modes() -> None:
    assert window_never_reached({"mode": "gravac"}, 500) and not window_never_reached({"mode": "gravac"}, 501)
    assert not window_never_reached({"mode": "static", "compressor": "topk"}, 3)
    assert not window_never_reached(None, 3) and not window_never_reached({}, 3)      # {} is the static default


def test_the_label_names_the_levels_sent() -> None:
    assert system_label("gv", SHORT, 6, [1.0, 10.0, 20.0, None, 10.0]) == "gv (window never reached: static θ 10/20)"
    assert system_label("gv", SHORT, 6) == "gv (window never reached: static θ_min)"
    assert system_label("gv", SHORT, 7, [10.0]) == "gv"


def _e2e_run(out: Path, sections: dict) -> None:
    """A bench_e2e directory: meta.json, configs/<id>.json, systems/<id>/steps.jsonl (6 steps each)."""
    (out / "configs").mkdir(parents=True)
    for sid, section in sections.items():
        if section is not None:
            (out / "configs" / f"{sid}.json").write_text(json.dumps({"gravac": section}))
        (out / "systems" / sid).mkdir(parents=True)
        recs = [{"step": i + 1, "loss": 3.0 - 0.3 * i, "time/step": 1.0, "bytes_sent": 1e6,
                 "cf_sent": 1.0 if i == 0 or section is None else 10.0} for i in range(6)]
        (out / "systems" / sid / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    meta = {"env": {}, "model": "mlp", "N": 2, "steps": 6, "network": {"rate": "loopback", "delay": "0"},
            "systems": {sid: {} for sid in sections}}
    (out / "meta.json").write_text(json.dumps(meta))


def test_e2e_report_labels_only_the_row_that_never_reached_its_window(tmp_path: Path) -> None:
    out = tmp_path / "e2e"
    _e2e_run(out, {"ds_dense": None, "gv_short": SHORT, "gv_searching": {**SHORT, "window": 2}})
    results = report(out)
    labels = {s["id"]: s["label"] for s in results["systems"]}
    assert labels == {"ds_dense": "ds_dense", "gv_short": "gv_short (window never reached: static θ 10)",
                      "gv_searching": "gv_searching"}
    md = (out / "results.md").read_text()
    assert "| gv_short (window never reached: static θ 10) |" in md and "| gv_searching |" in md


def test_fidelity_table_shows_the_row_label() -> None:
    row = {"id": "gv_short", "label": system_label("gv_short", SHORT, 6, [10.0]), "family": "sparsification",
           "final_loss": 1.5, "dense_loss": 1.4, "gap": 0.07, "eval": {}, "bytes_ratio": 0.1, "peak": 3.0,
           "steps_to_target": None, "rates": {}, "verdict": "ok"}
    res = {"clusters": {}, "model": "mlp", "steps": 6, "reference": "ds_dense", "target_fraction": 0.75,
           "target_loss": 1.6, "systems": [row, {**row, "id": "gv_plain", "label": "gv_plain"}]}
    md = fidelity_markdown(res)
    assert "| gv_short (window never reached: static θ 10) | sparsification |" in md
    assert "| gv_plain | sparsification |" in md
