"""The noise probe's estimators against values derived by hand (ds_gravac_bench/noise_probe.py)."""
import pytest
import torch

from ds_gravac_bench.noise_probe import mean_noise, sample, summarize


def test_opposite_noises_leave_the_mean_exact_and_count_once():
    # g_i = G ± e: the mean is G, mean_i ‖g_i‖² = ‖G‖² + ‖e‖² (the cross terms cancel), so N = ‖e‖²/(2 − 1).
    g = torch.tensor([3.0, 4.0])          # ‖G‖² = 25
    e = torch.tensor([1.0, -2.0])         # ‖e‖² = 5
    s, n = mean_noise([g + e, g - e])
    assert s == pytest.approx(25.0, rel=1e-12)
    assert n == pytest.approx(5.0, rel=1e-12)


def test_three_ranks_divide_by_two():
    # ranks (1, 0), (0, 1), (-1, -1): mean 0, S = 0; mean_i ‖g_i‖² = (1 + 1 + 2)/3 = 4/3; N = (4/3)/2.
    s, n = mean_noise([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([-1.0, -1.0])])
    assert s == pytest.approx(0.0, abs=1e-15)
    assert n == pytest.approx(2.0 / 3.0, rel=1e-12)


def test_one_rank_is_refused():
    with pytest.raises(ValueError, match="at least 2 ranks"):
        mean_noise([torch.ones(3)])


def test_sample_sums_the_svd_tail_of_the_mean_of_large_matrices_only():
    # The mean is diag(4, 3, 2, 1) padded to 128 × 128 (≥ 16,384 elements): unsent at rank 1 is 9 + 4 + 1 = 14,
    # at rank 2 is 5; S = 30; the ranks' opposite noise ±E with ‖E‖² = 2 gives N = 2. A vector is skipped.
    mean = torch.zeros(128, 128)
    mean[0, 0], mean[1, 1], mean[2, 2], mean[3, 3] = 4.0, 3.0, 2.0, 1.0
    noise = torch.zeros(128, 128)
    noise[5, 7], noise[9, 2] = 1.0, -1.0
    bias = torch.ones(128)
    row = sample([[mean + noise, bias], [mean - noise, -bias]], ranks=(1, 2, 4))
    assert row["S"] == pytest.approx(30.0, rel=1e-12)
    assert row["N"] == pytest.approx(2.0, rel=1e-12)
    assert row["unsent"] == pytest.approx({1: 14.0, 2: 5.0, 4: 0.0}, rel=1e-9, abs=1e-9)
    # residual in flight S·u/(1 − u): rank 1 u = 14/30 → 30·(14/30)/(16/30) = 26.25; rank 2 → 30·(5/30)/(25/30) = 6
    assert row["inflight"] == pytest.approx({1: 26.25, 2: 6.0, 4: 0.0}, rel=1e-9, abs=1e-9)


def test_summary_skips_the_warm_up_and_reports_each_ratio():
    rows = [{"step": 50, "S": 1.0, "N": 1.0, "unsent": {4: 0.9, 8: 0.9, 16: 0.9}, "inflight": {4: 9.0, 8: 9.0, 16: 9.0}},
            {"step": 150, "S": 2.0, "N": 1.0, "unsent": {4: 1.0, 8: 0.5, 16: 0.2}, "inflight": {4: 2.0, 8: 1.0, 16: 0.5}},
            {"step": 200, "S": 4.0, "N": 2.0, "unsent": {4: 1.0, 8: 0.5, 16: 0.2}, "inflight": {4: 3.0, 8: 1.0, 16: 1.0}}]
    out = summarize(rows, after=100)
    assert out["samples"] == 2
    assert out["N/S"] == {"mean": 0.5, "min": 0.5, "max": 0.5}
    assert out["r4"]["M/N"] == {"mean": 1.75, "min": 1.5, "max": 2.0}
    assert out["r4"]["M/M16"] == {"mean": 3.5, "min": 3.0, "max": 4.0}
    assert out["r16"]["u"] == {"mean": 0.075, "min": 0.05, "max": 0.1}


def test_the_tool_samples_a_real_task_and_summarizes_its_file(tmp_path):
    """Two steps of `lstm_long` through the runner's own task: every sample's unsent energy falls with the rank and
    never exceeds the energy; the summary reads the file back."""
    import json

    from ds_gravac_bench.noise_probe import RANKS, main

    out = tmp_path / "probe.json"
    main(["--task", "lstm_long", "--steps", "2", "--every", "1", "--out", str(out)])
    run = json.loads(out.read_text())
    assert [s["step"] for s in run["samples"]] == [1, 2]
    for s in run["samples"]:
        unsent = [s["unsent"][str(r)] for r in RANKS]
        assert s["S"] > 0 and s["N"] > 0
        assert all(0.0 <= b <= a <= s["S"] * (1 + 1e-9) for a, b in zip(unsent, unsent[1:]))
    summary = tmp_path / "summary.json"
    main(["--summary", str(summary), str(out)])
    table = json.loads(summary.read_text())["tasks"]
    assert table["lstm_long"]["samples"] == 0       # both samples are inside the 100-step warm-up
