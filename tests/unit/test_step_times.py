"""``ds_gravac_bench.step_times``: medians past the skipped steps, mean bytes, the rate read from meta.json, no
machine paths, and a clear error for a malformed argument — on real files written here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.step_times import main


def _run_dir(root: Path, times: dict[str, list[float]]) -> Path:
    (root / "systems").mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"env": {"cpu": "AMD EPYC", "cores": 2, "torch": "t"},
                                                "network": {"rate": "100mbit", "measured_mbit": 99.94}}))
    for name, ts in times.items():
        d = root / "systems" / name
        d.mkdir()
        lines = [json.dumps({"step": i, "time/step": t, "bytes_sent": 1000.0 * (i + 1)}) for i, t in enumerate(ts)]
        (d / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_medians_skip_the_first_steps_and_paths_are_stripped(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "r", {"a": [9.0, 9.0, 1.0, 3.0, 2.0], "b": [5.0, 0.5, 0.25, 0.75],
                                    "c": [0.0, 0.0, 1.0, 1.0, 4.0]})
    out = tmp_path / "kept.json"
    main([str(out), f"100mbit={run}", "--title", "t", "--command", f"python x --out {tmp_path}/y"])
    kept = json.loads(out.read_text())
    a, b = kept["rates"]["100mbit"]["systems"]["a"], kept["rates"]["100mbit"]["systems"]["b"]
    assert a == {"median_s": 2.0, "mean_s": 2.0, "steps": 3, "mean_bytes": 4000}   # steps 2..4: 1, 3, 2 s
    assert b == {"median_s": 0.5, "mean_s": 0.5, "steps": 2, "mean_bytes": 3500}
    assert kept["rates"]["100mbit"]["systems"]["c"]["median_s"] == 1.0      # a sending step every third
    assert kept["rates"]["100mbit"]["systems"]["c"]["mean_s"] == 2.0
    assert kept["rates"]["100mbit"]["measured_mbit"] == 99.9
    assert str(tmp_path) not in out.read_text()


def test_rounds_give_the_median_of_round_medians_their_spread_and_paired_ratios(tmp_path: Path) -> None:
    """Three rounds of one rate (skip 2 steps each): ``ref`` 1.0 / 1.2 / 0.8 s, ``x`` 0.5 / 0.8 / 0.4 s; ``y`` ran
    in two rounds only. Worked by hand: x's median of medians 0.5, spread (0.8 − 0.4) / 0.5 = 0.8, paired ratios
    2.0 / 1.5 / 2.0."""
    rounds = [f"{_run_dir(tmp_path / f'r{k}', {'ref': [9.0, 9.0, r], 'x': [9.0, 9.0, x]})}" for k, (r, x) in
              enumerate(((1.0, 0.5), (1.2, 0.8), (0.8, 0.4)))]
    for k in range(2):          # y ran in invocations of its own, one per round: RATE=DIR,DIR is one round
        rounds[k] += f",{_run_dir(tmp_path / f'y{k}', {'y': [9.0, 9.0, 3.0]})}"
    out = tmp_path / "kept.json"
    main([str(out), *(f"1gbit={d}" for d in rounds), "--title", "t", "--command", "c", "--reference", "ref"])
    table = json.loads(out.read_text())["rates"]["1gbit"]
    x, ref, y = table["systems"]["x"], table["systems"]["ref"], table["systems"]["y"]
    assert table["rounds"] == 3 and table["measured_mbit"] == 99.9
    assert (x["median_s"], x["round_medians"], x["spread"]) == (0.5, [0.5, 0.8, 0.4], 0.8)
    assert (x["rounds"], x["steps"]) == (3, 3)
    assert x["vs_reference"] == {"system": "ref", "median": 2.0, "min": 1.5, "max": 2.0}
    assert "vs_reference" not in ref and ref["median_s"] == 1.0 and ref["spread"] == 0.4
    assert y["rounds"] == 2 and y["vs_reference"]["median"] == pytest.approx(round((1.0 / 3 + 1.2 / 3) / 2, 3))


def test_a_malformed_rate_argument_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="RATE=DIR"):
        main([str(tmp_path / "o.json"), "runs/x", "--title", "t", "--command", "c"])
