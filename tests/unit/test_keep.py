"""Compact result files keep a report's figures, drop its per-step curves and name no absolute path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.keep import keep, strip_paths
from ds_gravac_bench.report import add_comparisons, system_summary


def test_strip_paths_keeps_only_the_last_component_of_absolute_paths() -> None:
    assert strip_paths("Clusters: 1gbit = /srv/x/runs/e2e-a, /srv/x/runs/e2e-b.") == "Clusters: 1gbit = e2e-a, e2e-b."
    assert strip_paths({"runs": ["/srv/u/r/fid-s0"], "note": "x=/var/q"}) == {"runs": ["fid-s0"], "note": "x=q"}
    for kept in ("compute / codec", "1/CF", "runs/e2e-a", "~/data", "https://example.org/a/b", "/"):
        assert strip_paths(kept) == kept


def test_a_kept_file_holds_the_figures_without_curves_or_paths(tmp_path: Path) -> None:
    e2e = tmp_path / "e2e"
    e2e.mkdir()
    systems = [system_summary(sid, [{"time/step": t, "loss": 3.0 - 0.1 * i} for i in range(8)], {})
               for sid, t in (("ds_dense", 2.0), ("gv_topk_100", 0.5))]
    target = add_comparisons(systems, None)
    (e2e / "results.json").write_text(json.dumps({"model": "mlp", "target_loss": target, "systems": systems}))
    fid = tmp_path / "fid"
    fid.mkdir()
    (fid / "fidelity.json").write_text(json.dumps({"model": "mlp", "runs": [str(tmp_path / "runs" / "loop")],
                                                   "clusters": {"1gbit": f"{tmp_path}/c1, {tmp_path}/c2"},
                                                   "systems": []}))
    out = tmp_path / "kept" / "table.json"
    kept = keep(out, [e2e, fid], "a table", "python -m ds_gravac_bench.e2e run ...", commit="abc1234")
    text = out.read_text()
    assert str(tmp_path) not in text and json.loads(text) == kept
    e2e_kept = next(v for k, v in kept["sources"].items() if k.endswith("e2e"))
    fast = next(s for s in e2e_kept["systems"] if s["id"] == "gv_topk_100")
    assert fast["step_time"]["median"] == 0.5 and fast["speedup_vs_ds_dense"] == pytest.approx(4.0)
    assert not {"loss", "smoothed", "step_times", "cf_sent", "branch"} & set(fast)
    fid_kept = next(v for k, v in kept["sources"].items() if k.endswith("fid"))
    assert fid_kept["runs"] == ["loop"] and fid_kept["clusters"] == {"1gbit": "c1, c2"}


def test_a_directory_without_a_report_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="holds no results.json"):
        keep(tmp_path / "out.json", [tmp_path], "t", "c")


def test_a_kept_dense_curve_is_written_alike_after_a_restore() -> None:
    """``long_keep``'s compact curve of a run rebuilt from it is the same text: a save after a restore leaves the
    kept ``reference.json`` unchanged (once, each round trip moved the evaluations' ``step`` key and rewrote it)."""
    from ds_gravac_bench.long_keep import compact_curve, expand_curve

    records = [{"loss": 3.0 - 0.01 * i, "time/step": 0.5, "bytes_sent": 100.0, "step": i + 1} for i in range(6)]
    records[2] = {"eval/top1": 0.25, "eval/loss": 2.5, **records[2]}       # the runner logs evaluations first
    records[5] = {**records[5], "eval/top1": 0.5, "eval/loss": 2.0}
    kept = json.dumps(compact_curve(records))
    assert json.dumps(compact_curve(expand_curve(json.loads(kept), "ds_dense"))) == kept
    assert [list(e) for e in json.loads(kept)["evals"]] == [["eval/loss", "eval/top1", "step"]] * 2
