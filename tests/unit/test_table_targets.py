"""The fidelity table's targets: the loss target (dense's smoothed loss at a fraction of the budget, replaced by its window's median only when that
point is an excursion — checked on hand-made curves against a float64 reference and on the kept dense runs."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ds_gravac_bench.fidelity import build
from ds_gravac_bench.fidelity_output import markdown
from ds_gravac_bench.long_keep import _decode
from ds_gravac_bench.table_targets import held_out_target, interim_evals, loss_target
from ds_gravac_bench.report import smooth
from fidelity_report_cases import DENSE, _write_run

ROOT = Path(__file__).resolve().parents[2]


def _ema64(values: np.ndarray, alpha: float = 0.1) -> np.ndarray:
    """Exponential average in closed form, float64: s_k = (1-a)^k x_0 + sum_{j=1..k} a (1-a)^(k-j) x_j."""
    k = np.arange(len(values))
    weights = alpha * (1 - alpha) ** (k[:, None] - k[None, :]) * (k[:, None] >= k[None, :])
    weights[:, 0] = (1 - alpha) ** k
    return weights @ values


def _plateau(n: int, spike_at: int | None) -> list[float]:
    """A noisy plateau at 2.8 (±0.35 per step, as ResNet-18's late loss), with four steps at 6.0 just before
    ``spike_at`` (0-based) when given."""
    x = 2.8 + 0.35 * np.random.default_rng(0).standard_normal(n)
    if spike_at is not None:
        x[spike_at - 3:spike_at + 1] = 6.0
    return x.tolist()


def test_a_smooth_descent_keeps_the_point() -> None:
    target, replaced = loss_target(smooth(DENSE), 0.9)
    assert replaced is None and target == smooth(DENSE)[89]


def test_a_quiet_plateau_keeps_the_point() -> None:
    curve = smooth(_plateau(1000, None))
    assert loss_target(curve, 0.9) == (curve[899], None)


def test_an_excursion_is_replaced_by_the_window_median() -> None:
    raw = _plateau(1000, 899)
    ema = _ema64(np.array(raw))
    window = ema[899 - 25:899 + 26]                      # 5% of 1,000 steps, centred on step 900
    median = float(np.median(window))
    z = (ema[899] - median) / (1.4826 * float(np.median(np.abs(window - median))))
    assert z > 3                                          # the case is an excursion by the float64 reference
    target, replaced = loss_target(smooth(raw), 0.9)
    assert target == pytest.approx(median, rel=1e-12)
    assert replaced["point"] == pytest.approx(ema[899], rel=1e-12) and replaced["z"] == pytest.approx(z, rel=1e-9)
    assert replaced["window"] == [875, 925]


def test_the_table_uses_and_names_the_replaced_target(tmp_path: Path) -> None:
    raw = _plateau(1000, 899)
    loop = _write_run(tmp_path / "loop", "resnet18", {"ds_dense": {"loss": raw, "time": 0.1, "bytes": 1000.0}},
                      fidelity={"task": "x", "target_fraction": 0.9, "top1_margin": None})
    res = build(loop, {})
    assert res["target_loss"] == pytest.approx(float(np.median(_ema64(np.array(raw))[874:925])), rel=1e-12)
    assert res["target_excursion"]["window"] == [875, 925]
    assert "the median of the smoothed curve over steps 875–925" in markdown(res)
    first = next(i + 1 for i, v in enumerate(smooth(raw)) if v <= res["target_loss"])
    assert {r["id"]: r for r in res["systems"]}["ds_dense"]["steps_to_target"] == first


@pytest.mark.parametrize("kept", sorted(p.parent.name for p in (ROOT / "docs/bench/long").glob("*/reference.json")))
def test_the_kept_dense_runs(kept: str) -> None:
    """Only ``resnet18_long`` seed 2's point is an excursion; every other kept table keeps its target."""
    ref = json.loads((ROOT / "docs/bench/long" / kept / "reference.json").read_text())
    curve = smooth(_decode(ref["curve"]["loss"]))
    target, replaced = loss_target(curve, 0.9)
    if kept == "resnet18_long-s2":
        assert replaced is not None and replaced["z"] > 3 and target < replaced["point"] - 0.2
    else:
        assert replaced is None and target == curve[int(0.9 * len(curve)) - 1]


def test_interim_evaluations_are_those_on_the_first_ones_images() -> None:
    records = [{"step": 1, "loss": 3.0}, {"step": 200, "eval/top1": 0.2, "eval/samples": 2560.0},
               {"step": 400, "eval/top1": 0.3, "eval/samples": 2560.0}, {"step": 401, "loss": 2.0},
               {"step": 600, "eval/top1": 0.5, "eval/samples": 10000.0}]
    assert interim_evals(records) == [(200, 0.2), (400, 0.3)]
    same = [{"step": 5, "eval/top1": 0.4}, {"step": 10, "eval/top1": 0.6}]          # no sample counts: all alike
    assert interim_evals(same) == [(5, 0.4), (10, 0.6)]
    assert interim_evals([{"step": 3, "loss": 1.0}]) == []


def test_the_held_out_target_is_dense_s_final_level_on_the_interim_images() -> None:
    evals = [(200, 0.10), (400, 0.30), (600, 0.31), (800, 0.29), (1000, 0.33)]
    assert held_out_target(evals, 0.005) == pytest.approx((0.31 + 0.29 + 0.33) / 3 - 0.005)
    assert held_out_target(evals[:2], 0.01) == pytest.approx((0.10 + 0.30) / 2 - 0.01)
    assert held_out_target([], 0.005) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kept_resnet18_runs_evaluate_2560_images_then_all(seed: int) -> None:
    """On the kept dense runs the interim evaluations read 2,560 images and the last one all 10,000: the target is
    the mean of the last three interim ones (steps 5,400–5,800), and the whole-set one is not among them."""
    ref = json.loads((ROOT / f"docs/bench/long/resnet18_long-s{seed}/reference.json").read_text())
    evals = ref["curve"]["evals"]
    interim = interim_evals(evals)
    assert [s for s, _ in interim][-3:] == [5400, 5600, 5800] and len(interim) == len(evals) - 1
    expected = np.mean([e["eval/top1"] for e in evals if e["eval/samples"] == 2560.0][-3:]) - 0.005
    assert held_out_target(interim, 0.005) == pytest.approx(expected, rel=1e-12)
