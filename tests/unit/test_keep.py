"""Compact result files keep a report's figures, drop its per-step curves and name no absolute path."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.keep import keep, strip_paths
from ds_gravac_bench.report import add_comparisons, system_summary

REPO = Path(__file__).resolve().parents[2]


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


def _kept_copy(tmp_path: Path) -> Path:
    """A copy of a kept seed of the repository: the real file ``drop`` edits."""
    kept = tmp_path / "lstm_long-s0"
    kept.mkdir()
    for name in ("fidelity.json", "reference.json"):
        (kept / name).write_bytes((REPO / "docs/bench/long/lstm_long-s0" / name).read_bytes())
    return kept


def test_drop_removes_only_the_named_rows_and_the_seed_still_reads(tmp_path: Path) -> None:
    from ds_gravac_bench.fidelity_seeds import seed_table
    from ds_gravac_bench.long_keep import drop

    kept = _kept_copy(tmp_path)
    before = json.loads((kept / "fidelity.json").read_text())
    victims = [r["id"] for r in before["systems"] if r["id"].startswith("gv_topk_")]
    assert len(victims) == 2                         # gv_topk_10 and gv_topk_100 in the kept seed
    drop(kept, victims)
    after = json.loads((kept / "fidelity.json").read_text())
    assert after["systems"] == [r for r in before["systems"] if r["id"] not in victims]
    assert {k: v for k, v in after.items() if k != "systems"} == {k: v for k, v in before.items() if k != "systems"}
    assert (kept / "reference.json").read_bytes() == (REPO / "docs/bench/long/lstm_long-s0/reference.json").read_bytes()
    assert [r["id"] for r in seed_table([kept], {})["systems"]] == [r["id"] for r in after["systems"]]


def test_drop_of_the_noise_control_takes_its_floor_with_it(tmp_path: Path) -> None:
    from ds_gravac_bench.long_keep import drop

    kept = _kept_copy(tmp_path)
    assert json.loads((kept / "fidelity.json").read_text())["noise_floor"] is not None
    drop(kept, ["ds_dense_jitter"])
    assert json.loads((kept / "fidelity.json").read_text())["noise_floor"] is None


@pytest.mark.parametrize("ids, says", [(["ds_dense"], "reference"), (["gv_auto at 10gbit", "gv_topk_10"], "holds no row")])
def test_drop_refuses_the_reference_and_unknown_ids_before_writing(tmp_path: Path, ids: list[str], says: str) -> None:
    from ds_gravac_bench.long_keep import drop

    kept = _kept_copy(tmp_path)
    before = (kept / "fidelity.json").read_bytes()
    with pytest.raises(SystemExit, match=says) as err:
        drop(kept, ids)
    assert (kept / "fidelity.json").read_bytes() == before
    if says == "holds no row":
        assert "'gv_auto at 10gbit'" in str(err.value) and "'gv_topk_10'" in str(err.value).split("its rows:")[1]
