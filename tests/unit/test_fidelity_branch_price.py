"""A controller priced per branch at a rate its whole run was not made at: the segments must retrace the run, each
branch takes its median step over the segments, and the ratio uses ddp_bf16 measured beside them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity_branch_price import branch_of, branch_prices, departures, price_report, priced_time
from ds_gravac_bench.fidelity_reference import REFERENCE_DIR
from fidelity_report_cases import DENSE, _write_run

SYSTEM = "gv_gravac@gravac.window=500"
# the whole run: step 1 dense, 2–5 CF 10, 6–9 dense (the gain under ε), 10–12 CF 10
BRANCHES = ["dense"] + ["min"] * 4 + ["dense"] * 4 + ["min"] * 3
LOSS = [3.0 - 0.1 * i for i in range(12)]


def _records(steps: range, times: list[float], loss: list[float] = LOSS) -> list[dict]:
    return [{"step": s, "loss": loss[s - 1], "branch": BRANCHES[s - 1], "cf_sent": 1.0 if BRANCHES[s - 1] == "dense"
             else 10.0, "time/step": t} for s, t in zip(steps, times)]


def _write(root: Path, system: str, records: list[dict], reference_step: float | None = None) -> Path:
    (root / "systems" / system).mkdir(parents=True)
    (root / "systems" / system / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if reference_step is not None:
        _write_run(root / REFERENCE_DIR, "resnet18", {"ddp_bf16": {
            "loss": DENSE[:12], "time": [5.0, 5.0] + [reference_step] * 10, "bytes": 1.0, "family": "baseline"}})
    return root


@pytest.fixture()
def kept(tmp_path: Path) -> Path:
    """The kept table: the controller reaches the loss target at step 7 and the held-out one at step 10; ddp_bf16
    at steps 6 and 8."""
    keep = tmp_path / "keep"
    keep.mkdir()
    rows = [{"id": f"{SYSTEM} at 1gbit", "system": SYSTEM, "steps_to_target": 7, "steps_to_top1": 10},
            {"id": "ddp_bf16", "system": None, "steps_to_target": 6, "steps_to_top1": 8}]
    (keep / "fidelity.json").write_text(json.dumps({"systems": rows}))
    return keep


def test_each_branch_is_priced_by_its_median_over_the_segments_past_their_first_two_steps(tmp_path: Path) -> None:
    fresh = _records(range(1, 6), [9.0, 9.0, 2.0, 2.2, 2.4])
    resumed = _records(range(6, 13), [8.0, 8.0, 4.0, 4.4, 1.9, 2.1, 2.3])
    prices = branch_prices([fresh, resumed])
    # CF 10: steps 3–5 and 10–12 → median of 1.9, 2.0, 2.1, 2.2, 2.3, 2.4 = 2.15; dense: steps 8, 9 → 4.2
    assert prices == {"dense@1": {"step_s": pytest.approx(4.2), "n": 2},
                      "min@10": {"step_s": pytest.approx(2.15), "n": 6}}
    run = _records(range(1, 13), [0.5] * 12)
    time_s, counts = priced_time(run, 10, prices)
    assert counts == {"dense@1": 5, "min@10": 5}
    assert time_s == pytest.approx(5 * 4.2 + 5 * 2.15)
    assert priced_time(run, 10, {"min@10": prices["min@10"]}) == (None, counts)     # dense has no price


def test_the_report_divides_ddp_bf16_beside_the_segments_by_the_priced_time(tmp_path: Path, kept: Path) -> None:
    run_dir = _write(tmp_path / "run1g", SYSTEM, _records(range(1, 13), [0.5] + [0.3] * 4 + [0.6] * 4 + [0.3] * 3))
    a = _write(tmp_path / "fresh", SYSTEM, _records(range(1, 6), [9.0, 9.0, 2.0, 2.2, 2.4]), reference_step=1.0)
    b = _write(tmp_path / "s5", SYSTEM, _records(range(6, 13), [8.0, 8.0, 4.0, 4.4, 1.9, 2.1, 2.3]),
               reference_step=1.2)
    lines = price_report(kept, f"{SYSTEM} at 1gbit", run_dir, [a, b])
    text = "\n".join(lines)
    assert "segment fresh/" + SYSTEM + ": steps 1–5, retraces the run" in text
    assert "ddp_bf16 beside the segments: 1.000, 1.200 s (median 1.100)" in text
    # loss target, step 7: dense × 3 (steps 1, 6, 7), CF 10 × 4 → 3 × 4.2 + 4 × 2.15 = 21.2 s; ddp_bf16 6 × 1.1
    assert "loss target: step 7 (dense@1 × 3, min@10 × 4): 21 s; ddp_bf16 6 × 1.100 s = 7 s; × ddp_bf16: 0.31" in text
    # held-out target, step 10: 5 × 4.2 + 5 × 2.15 = 31.75 s; ddp_bf16 8 × 1.1 = 8.8 s → 0.28
    held_out = "held-out target: step 10 (dense@1 × 5, min@10 × 5): 32 s; ddp_bf16 8 × 1.100 s = 9 s; × ddp_bf16: 0.28"
    assert held_out in text
    # at the run's own rate: dense at 0.6 (steps 6–9; past the first two steps), CF 10 at 0.3. To step 10 that prices
    # 5 × 0.6 + 5 × 0.3 = 4.5 s against 4.4 s measured (step 1 took 0.5 s): +2.3%; to step 7, 3.0 against 2.9: +3.4%
    assert "measured (+2.3%)" in text and "measured (+3.4%)" in text


def test_a_segment_that_departs_from_the_run_is_refused_and_another_setting_only_adds_prices(
        tmp_path: Path, kept: Path) -> None:
    run_dir = _write(tmp_path / "run1g", SYSTEM, _records(range(1, 13), [0.5] * 12))
    other = _records(range(1, 6), [9.0, 9.0, 2.0, 2.2, 2.4], loss=[x + 1 for x in LOSS])
    c = _write(tmp_path / "other", f"{SYSTEM}@gravac.epsilon=0.9", other, reference_step=1.0)
    assert "another setting: prices only" in "\n".join(price_report(kept, f"{SYSTEM} at 1gbit", run_dir, [c]))
    moved = _records(range(1, 6), [9.0, 9.0, 2.0, 2.2, 2.4])
    moved[3]["loss"] += 1e-6
    assert departures(_records(range(1, 13), [0.5] * 12), moved) == [4]
    bad = _write(tmp_path / "moved", SYSTEM, moved, reference_step=1.0)
    with pytest.raises(SystemExit, match=r"departs from the run at steps \[4\]"):
        price_report(kept, f"{SYSTEM} at 1gbit", run_dir, [bad])


def test_accordion_steps_are_priced_per_layer_pattern_not_per_nominal_cf() -> None:
    """Accordion logs its high CF as ``cf_sent`` whatever share of layers it sends at its low level, so two of its
    steps with different patterns (all layers at CF 1.01, sending dense bytes, and all at CF 10) must not share a
    price: each pattern is its own branch, and a dense step stays one."""
    def step(low: float, sent_bytes: float, branch: str = "cand") -> dict:
        return {"branch": branch, "cf_sent": 10.0, "accordion/low_fraction": low, "comm/bytes_sent": sent_bytes}

    all_low, all_high = step(1.0, 18_612_800.0), step(0.0, 3_764_800.0)
    assert branch_of(all_low) == "cand@10 low 1.00 18.6 MB"
    assert branch_of(all_high) == "cand@10 low 0.00 3.8 MB"
    assert branch_of({**step(1.0, 18_612_800.0, "dense"), "cf_sent": 1.0}) == "dense@1"
    timed = [(all_low, 9.0), (all_low, 9.0), (all_low, 1.9), (all_low, 2.1), (all_high, 0.5), (all_high, 0.7)]
    prices = branch_prices([[{**r, "step": i + 10, "time/step": t} for i, (r, t) in enumerate(timed)]])  # 2 skipped
    assert prices == {"cand@10 low 0.00 3.8 MB": {"step_s": pytest.approx(0.6), "n": 2},
                      "cand@10 low 1.00 18.6 MB": {"step_s": pytest.approx(2.0), "n": 2}}


def test_a_branch_sent_only_at_the_start_is_priced_by_the_segments_start() -> None:
    """Accordion sends one forced dense step at step 1 and never again: no step past the skipped start prices it,
    so the fresh segment's own step 1 does; a branch the body prices keeps its body's median."""
    fresh = _records(range(1, 6), [9.0, 3.0, 2.0, 2.2, 2.4])
    prices = branch_prices([fresh])
    assert prices == {"dense@1": {"step_s": 9.0, "n": 1}, "min@10": {"step_s": pytest.approx(2.2), "n": 3}}


def test_save_keeps_the_priced_times_as_the_row_s_time_at_the_segments_rate(
        tmp_path: Path, kept: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--save 100mbit`` writes the two priced times (21.2 s and 31.75 s, derived in the report test above) and
    ddp_bf16's median step beside the segments into the row; a row trained at that rate is refused, since its own
    run's time stands there."""
    from ds_gravac_bench.fidelity_branch_price import main

    run_dir = _write(tmp_path / "run1g", SYSTEM, _records(range(1, 13), [0.5] + [0.3] * 4 + [0.6] * 4 + [0.3] * 3))
    a = _write(tmp_path / "fresh", SYSTEM, _records(range(1, 6), [9.0, 9.0, 2.0, 2.2, 2.4]), reference_step=1.0)
    b = _write(tmp_path / "s5", SYSTEM, _records(range(6, 13), [8.0, 8.0, 4.0, 4.4, 1.9, 2.1, 2.3]),
               reference_step=1.2)
    args = ["--keep", str(kept), "--row", f"{SYSTEM} at 1gbit", "--run", str(run_dir), "--segments", str(a), str(b)]
    main(args + ["--save", "100mbit"])
    assert f"kept as '{SYSTEM} at 1gbit' at 100mbit (priced per branch)" in capsys.readouterr().out
    row = json.loads((kept / "fidelity.json").read_text())["systems"][0]
    assert row["rates"]["100mbit"] == {"step_s": None, "time_s": pytest.approx(21.2),
                                       "top1_time_s": pytest.approx(31.75), "source": "priced per branch",
                                       "reference": {"system": "ddp_bf16", "step_s": pytest.approx(1.1)}}

    report = json.loads((kept / "fidelity.json").read_text())
    report["systems"][0]["trained_at"] = "100mbit"
    (kept / "fidelity.json").write_text(json.dumps(report))
    with pytest.raises(SystemExit, match="was trained at 100mbit"):
        main(args + ["--save", "100mbit"])


def test_a_loopback_row_is_priced_from_its_loopback_run_and_an_unknown_row_is_named(tmp_path: Path) -> None:
    """GraVAC ε 0.9 on resnet18_long's seeds 1 and 2 ran on loopback only: its kept row is the system's own id, with
    no ``system`` field (a cluster row's id adds " at RATE"). Its branches come from the loopback run; an id the
    kept report lacks is refused with the ids it has, not a KeyError."""
    keep = tmp_path / "keep"
    keep.mkdir()
    rows = [{"id": SYSTEM, "steps_to_target": 7, "steps_to_top1": 10},
            {"id": "ddp_bf16", "steps_to_target": 6, "steps_to_top1": 8}]
    (keep / "fidelity.json").write_text(json.dumps({"systems": rows}))
    run_dir = _write(tmp_path / "loopback", SYSTEM, _records(range(1, 13), [0.5] * 12))
    seg = _write(tmp_path / "fresh", SYSTEM, _records(range(1, 6), [9.0, 9.0, 2.0, 2.2, 2.4]), reference_step=1.0)
    text = "\n".join(price_report(keep, SYSTEM, run_dir, [seg]))
    # only CF 10 is priced past the segment's first two steps (2.2 s), and dense only at its start: steps 1–2 at 9.0
    # (a fresh segment's start prices a branch sent only there). Loss target, step 7: dense × 3 (1, 6, 7) at 9.0,
    # CF 10 × 4 at 2.2 → 35.8 s; ddp_bf16 6 × 1.0 = 6 s → 0.17
    assert "loss target: step 7 (dense@1 × 3, min@10 × 4): 36 s; ddp_bf16 6 × 1.000 s = 6 s; × ddp_bf16: 0.17" in text
    with pytest.raises(SystemExit, match=r"has no row 'gv_gravac at 1gbit'; its rows: ddp_bf16, gv_gravac@"):
        price_report(keep, "gv_gravac at 1gbit", run_dir, [seg])
