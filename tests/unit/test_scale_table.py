"""The scale tool builds its table from a small recorded input (no launcher, no cluster, no planner)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ds_gravac_bench import scale
from ds_gravac_bench.scale_inputs import load_input, medians, run_records
from ds_gravac_bench.scale_table import build

FIXTURE = Path(__file__).parent / "data" / "scale_input_small.json"
ALPHA, BETA = 2e-4, 8.5e-8          # the fixture's probes were written from these


def by_key(table: dict) -> dict:
    return {(r["system"], r["n"]): r for r in table["rows"]}


def test_table_rows_measured_and_predicted() -> None:
    table = build(load_input(FIXTURE))
    rows = by_key(table)
    assert sorted({n for _, n in rows}) == [2, 3, 4, 8, 16, 64]
    for sid in ("ds_dense", "gv_topk"):
        assert [rows[(sid, n)]["status"] for n in (2, 3, 4, 8, 16, 64)] == ["measured"] * 3 + ["predicted"] * 3
        assert rows[(sid, 8)]["compute_source"] == "reference run"
    assert rows[("gv_topk", 2)]["compute_source"] == "own compute estimate"
    assert rows[("ds_dense", 2)]["compute_source"] == "ds_gravac runs' median compute estimate"
    assert rows[("gv_topk", 3)]["compute_source"] == "own compute estimate, codec of this run (oversubscribed)"
    assert table["laws"]["all_reduce"]["alpha_s"] == pytest.approx(ALPHA, rel=0.02)
    assert table["laws"]["all_gather"]["beta_s_per_byte"] == pytest.approx(BETA, rel=1e-3)


def test_predicted_row_against_hand_computation() -> None:
    rows = by_key(build(load_input(FIXTURE)))
    stage, wb = 0.005 / 1e6, 0.002 / 1e6                        # N = 2 record over all 10^6 elements
    enc, dec = 0.015 / 990000, 0.008 / (2 * 990000)             # all-gather at N = 2 decodes 2 rows
    n = 8
    gather = (n - 1) * ALPHA + (n - 1) * BETA * 4 * 19800
    ring = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * BETA * 4 * 10000
    want = 0.05 + (stage + wb) * 1e6 + enc * 990000 + n * dec * 990000 + gather + ring
    got = rows[("gv_topk", n)]["pred"]
    assert got["step"] == pytest.approx(want, rel=2e-3)
    assert got["bytes"] == pytest.approx((n - 1) * 4 * 19800 + 2 * (n - 1) / n * 4 * 10000)
    dense = rows[("ds_dense", n)]["pred"]                      # compute: the ds_gravac runs' median at N = 2
    assert dense["step"] == pytest.approx(0.05 + 0.007 + 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * BETA * 4e6, rel=2e-3)


def test_oversubscribed_row_uses_its_own_compute_and_codec() -> None:
    rows = by_key(build(load_input(FIXTURE)))
    r = rows[("gv_topk", 3)]
    comm = 2 * ALPHA + 2 * BETA * 4 * 19800 + 4 * ALPHA + 4 / 3 * BETA * 4 * 10000
    assert r["pred"]["step"] == pytest.approx(0.1 + 0.06 + comm, rel=2e-3)      # own compute and codec
    assert r["error"] == pytest.approx(r["pred"]["step"] / 0.4 - 1)
    assert r["error_compute_only"] == pytest.approx((0.12 + 0.06 + comm) / 0.4 - 1, rel=2e-3)
    r4 = rows[("gv_topk", 4)]                                   # no compute-only run at N = 4
    assert r4["pred"]["compute"] == pytest.approx(0.1) and r4["pred"]["codec"] == pytest.approx(0.08)
    assert r4["error_compute_only"] is None
    assert rows[("ds_dense", 4)]["pred"]["compute"] == pytest.approx(0.1)     # the gravac runs' median


def test_compute_override_moves_only_the_predicted_rows() -> None:
    base, quiet = (by_key(build(load_input(FIXTURE), compute_s=c)) for c in (None, 0.01))
    assert quiet[("gv_topk", 64)]["pred"]["step"] == pytest.approx(base[("gv_topk", 64)]["pred"]["step"] - 0.04)
    assert quiet[("gv_topk", 2)]["pred"]["step"] == pytest.approx(base[("gv_topk", 2)]["pred"]["step"])


def test_crossover_of_the_gather_system() -> None:
    cross = build(load_input(FIXTURE))["crossover"]
    assert [(c["system"], c["against"]) for c in cross] == [("gv_topk", "ds_dense")]
    hit = cross[0]["first_n_not_faster"]
    assert hit is None or hit > 2


def test_cli_table_writes_json_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    scale.main(["table", str(FIXTURE), "--json", str(tmp_path / "t.json"), "--csv", str(tmp_path / "t.csv")])
    out = capsys.readouterr().out
    assert "| gv_topk | 64 | predicted |" in out and "| ds_dense | 2 | measured |" in out
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert len(rows) == 12 and {r["status"] for r in rows} == {"measured", "predicted"}
    assert json.loads((tmp_path / "t.json").read_text())["rate"] == "100mbit"


def test_records_medians_skip_the_first_two_steps(tmp_path: Path) -> None:
    d = tmp_path / "systems" / "gv_x"
    d.mkdir(parents=True)
    steps = [9.0, 8.0, 1.0, 2.0, 3.0]
    d.joinpath("steps.jsonl").write_text("".join(json.dumps({"time/step": s, "comm_wait_s": s / 10}) + "\n"
                                                 for s in steps))
    got = run_records(tmp_path, ["gv_x", "absent"])
    assert list(got) == ["gv_x"] and got["gv_x"]["step_s"] == 2.0 and got["gv_x"]["comm_wait_s"] == 0.2
    assert medians([])["steps"] == 0


def test_bad_input_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not a scale input"):
        load_input(p)


def test_cli_summary_sets_rates_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table = build(load_input(FIXTURE))
    other = {**table, "rate": "1gbit"}
    paths = [tmp_path / "b.json"]
    paths[0].write_text(json.dumps(other))
    scale.main(["summary", str(FIXTURE), *map(str, paths)])          # an input and a table
    out = capsys.readouterr().out
    assert "100mbit: measured s" in out and "1gbit: measured s" in out
    assert "100mbit: **predicted** step at N = 8, 16, 64" in out and "‡" in out
    assert "| gv_topk | ds_dense |" in out
