"""``long_keep price``: a kept seed's static rows timed with the step prices another kept seed of the table holds."""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest

from ds_gravac_bench.kept_prices import price_like

KEPT = Path(__file__).resolve().parents[2] / "docs" / "bench" / "long"
ONE = "loopback steps × cluster step"


def _entries_equal(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    return all(math.isclose(a[k], b[k], rel_tol=1e-12) if isinstance(a[k], float) and isinstance(b[k], float)
               else a[k] == b[k] for k in a)


def test_a_kept_seed_repriced_from_another_reproduces_the_times_its_step_time_runs_gave(tmp_path: Path) -> None:
    """Seeds 1 and 2 of ``resnet18_long`` were each timed by ``long_keep save --cluster`` from the same step-time
    runs (medians of raw steps, through ``fidelity_time``). Seed 2's static rows, stripped of their times and priced
    like seed 1 through the command line, get every time, per-kind step and speed-up back."""
    from ds_gravac_bench.long_keep import main

    for seed in ("s1", "s2"):
        shutil.copytree(KEPT / f"resnet18_long-{seed}", tmp_path / seed)
    original = json.loads((tmp_path / "s2" / "fidelity.json").read_text())
    stripped = copy.deepcopy(original)
    static = [r["id"] for r in stripped["systems"] if not r.get("adaptive") and not r.get("trained_at")]
    for r in stripped["systems"]:
        if r["id"] in static:
            r["rates"] = {}
    (tmp_path / "s2" / "fidelity.json").write_text(json.dumps(stripped))
    main(["price", str(tmp_path / "s2"), "--like", str(tmp_path / "s1")])
    priced = {r["id"]: r for r in json.loads((tmp_path / "s2" / "fidelity.json").read_text())["systems"]}
    compared = 0
    for r in original["systems"]:
        for rate, entry in r["rates"].items():
            if r["id"] in static and entry.get("step_s") is not None:
                assert _entries_equal(priced[r["id"]]["rates"][rate], entry), (r["id"], rate)
                compared += 1
            elif r["id"] not in static:               # a controller's own times stay as they were
                assert priced[r["id"]]["rates"][rate] == entry
    assert compared == 26      # 13 static systems × 2 rates: dense starts and post-local SGD's quiet steps among them


def _like() -> dict:
    """A table whose times are derived by hand from the prices (the comments): what a step-time run would give."""
    return {"model": "resnet18", "steps": 6000, "target_fraction": 0.9, "top1_margin": 0.005, "reference": "ds_dense",
            "systems": [
                {"id": "ds_dense", "steps_to_target": 100, "steps_to_top1": 120,
                 "rates": {"100mbit": {"step_s": 2.0, "time_s": 200.0, "top1_time_s": 240.0, "source": ONE}}},
                {"id": "ddp_powersgd", "steps_to_target": 30, "steps_to_top1": None,   # 10 dense: 10·4 + 20·0.5
                 "rates": {"100mbit": {"step_s": 0.5, "dense_start_step_s": 4.0, "time_s": 50.0,
                                       "top1_time_s": None, "source": "10 dense steps × …"}}},
                {"id": "ddp_localsgd@period=8", "steps_to_target": 8, "steps_to_top1": None,    # 1·3 + 7·0.25
                 "quiet_steps": {"all": 14, "steps": 16, "to_target": 7, "to_top1": None},
                 "rates": {"100mbit": {"step_s": 9.5 / 16, "send_step_s": 3.0, "quiet_step_s": 0.25, "time_s": 4.75,
                                       "top1_time_s": None, "source": "loopback steps that send × …"}}},
                {"id": "gv_auto at 100mbit", "trained_at": "100mbit", "adaptive": True, "steps_to_target": 90,
                 "rates": {"100mbit": {"step_s": 0.3, "time_s": 27.0, "top1_time_s": None, "source": "cluster run"}}},
            ]}


def _table() -> dict:
    return {"model": "resnet18", "steps": 6000, "target_fraction": 0.9, "top1_margin": 0.005, "reference": "ds_dense",
            "systems": [
                {"id": "ds_dense", "steps_to_target": 50, "steps_to_top1": 60, "rates": {}},
                {"id": "ddp_powersgd", "steps_to_target": 8, "steps_to_top1": 12, "rates": {}},
                {"id": "ddp_localsgd@period=8", "steps_to_target": 10, "steps_to_top1": None, "rates": {},
                 "quiet_steps": {"all": 14, "steps": 16, "to_target": 9, "to_top1": None}},
                {"id": "ds_dense_jitter", "steps_to_target": 52, "steps_to_top1": 60, "rates": {}},
            ]}


def test_each_kind_of_step_is_priced_with_the_rows_own_steps() -> None:
    out, priced = price_like(_table(), _like(), Path("kept/like"))
    rows = {r["id"]: r["rates"].get("100mbit") for r in out["systems"]}
    assert rows["ds_dense"]["time_s"] == 100.0 and rows["ds_dense"]["top1_time_s"] == 120.0
    assert rows["ddp_powersgd"]["time_s"] == 32.0            # 8 steps, all inside the 10-step dense start
    assert rows["ddp_powersgd"]["top1_time_s"] == 41.0       # 10·4 + 2·0.5
    local = rows["ddp_localsgd@period=8"]
    assert local["time_s"] == 1 * 3.0 + 9 * 0.25 and local["top1_time_s"] is None
    assert local["step_s"] == (2 * 3.0 + 14 * 0.25) / 16
    assert rows["ddp_powersgd"]["speedup"] == 100.0 / 32.0 and rows["ddp_powersgd"]["top1_speedup"] == 120.0 / 41.0
    assert rows["ds_dense_jitter"] is None                   # the other seed prices no such row
    assert priced == ["ds_dense at 100mbit", "ddp_powersgd at 100mbit", "ddp_localsgd@period=8 at 100mbit"]
    assert out["priced_like"] == {"100mbit": "kept/like"}


def test_a_time_the_row_already_has_is_kept() -> None:
    table = _table()
    mine = {"step_s": 1.5, "time_s": 75.0, "top1_time_s": 90.0, "source": ONE}
    table["systems"][0]["rates"]["100mbit"] = dict(mine)
    out, priced = price_like(table, _like(), Path("kept/like"))
    assert out["systems"][0]["rates"]["100mbit"] == mine and "ds_dense at 100mbit" not in priced


def test_prices_that_do_not_give_the_other_rows_own_times_are_refused() -> None:
    like = _like()
    like["systems"][1]["rates"]["100mbit"]["time_s"] = 49.0        # not 10·4 + 20·0.5
    with pytest.raises(SystemExit, match="ddp_powersgd.*time_s 49.0 is not its prices"):
        price_like(_table(), like, Path("kept/like"))


def test_another_tables_prices_are_refused() -> None:
    like = _like()
    like["steps"] = 2000
    with pytest.raises(SystemExit, match="another table \\(steps differ\\)"):
        price_like(_table(), like, Path("kept/like"))


def test_post_local_sgd_without_its_quiet_step_count_is_refused() -> None:
    table = _table()
    del table["systems"][2]["quiet_steps"]
    with pytest.raises(SystemExit, match="ddp_localsgd@period=8.*quiet_steps"):
        price_like(table, _like(), Path("kept/like"))
