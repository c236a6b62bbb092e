"""The baselines users pick instead of compression, as benchmark systems on loopback (tiny_cnn, 4 steps, the real
launchers): DeepSpeed with 16-bit communication, DDP with torch's bf16 hook, torch's post-local SGD. Each writes the
step records the fidelity report compares (loss, time per step, bytes per step, held-out top-1), and every system
follows the runner's learning-rate schedule and evaluation options (a finer final evaluation included)."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher

STEPS = 4
SCHEDULE = ("--lr-warmup", "3", "--lr-decay-at", "0.75")      # factors 1/3, 2/3, 1, 0.1 for steps 0..3


def _run(tmp_path: Path, system: str) -> tuple[dict, list[dict]]:
    """Run ``system`` (or a comma list: the records are the first one's)."""
    from ds_gravac_bench.e2e import run_matrix

    opts = argparse.Namespace(model="tiny_cnn", rate="loopback", ranks=2, steps=STEPS, systems=system,
                              micro_batch=8, lr=None, epsilon=0.7, theta_min=10.0, ablation=None, tag=3, timeout=240,
                              out=str(tmp_path / "out"), smoke=False,
                              runner_extra=(*SCHEDULE, "--eval-every", "2", "--eval-batches", "2",
                                            "--final-eval-batches", "3"))
    out = run_matrix(opts)
    meta = json.loads((out / "meta.json").read_text())
    first = system.split(",")[0]
    recs = [json.loads(x) for x in (out / "systems" / first / "steps.jsonl").read_text().splitlines() if x.strip()]
    assert meta["systems"][first]["returncode"] == 0, (out / "systems" / first / "log.txt").read_text()[-3000:]
    return meta, recs


def _ring_bytes() -> float:
    """fp32 ring all-reduce of every tiny_cnn gradient at N = 2: 2(N-1)/N · 4 bytes per value."""
    from runners.models import TinyCNN

    return 4.0 * sum(p.numel() for p in TinyCNN(10).parameters())


def _check_records(recs: list[dict], base_lr: float) -> None:
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and r["time/step"] > 0 for r in recs)
    assert 0.0 <= recs[-1]["eval/top1"] <= 1.0
    # held-out images: 2 ranks × batches × micro batch 8 — periodic evaluations 2 batches, the final one 3
    assert [r.get("eval/samples") for r in recs] == [None, 2 * 2 * 8, None, 2 * 3 * 8]
    # the lr logged after step k is the one step k + 1 uses: warm-up (k + 2) / 3 capped at 1, ×0.1 from step 3 on
    assert [r["lr"] for r in recs] == pytest.approx([base_lr * f for f in (2 / 3, 1.0, 0.1, 0.1)])


@pytest.mark.parametrize("system", ["ds_fp16", "ds_bf16", "ddp_bf16"])
def test_sixteen_bit_baselines_send_half_of_fp32(tmp_path: Path, system: str) -> None:
    meta, recs = _run(tmp_path, system)
    ring = _ring_bytes()
    assert meta["systems"][system]["family"] == "baseline"
    assert all(r["bytes_sent"] == pytest.approx(ring / 2) and r["dense_bytes"] == pytest.approx(ring) for r in recs)
    _check_records(recs, meta["lr"])
    if system.startswith("ds_"):
        cfg = json.loads((tmp_path / "out" / "configs" / f"{system}.json").read_text())
        assert cfg["communication_data_type"] == system[3:] and "gravac" not in cfg


def test_post_local_sgd_sends_on_sync_and_averaging_steps_only(tmp_path: Path) -> None:
    """Start 1, period 2: step 0 all-reduces gradients, steps 1 and 3 average the parameters, step 2 is local."""
    meta, recs = _run(tmp_path, "ddp_localsgd@period=2@start=1")
    ring = _ring_bytes()
    assert [r["bytes_sent"] for r in recs] == pytest.approx([ring, ring, 0.0, ring])
    _check_records(recs, meta["lr"])


def test_ddp_and_deepspeed_train_bitwise_alike_at_two_ranks(tmp_path: Path) -> None:
    """At two ranks both sum two gradients and halve them exactly (in fp32, or both in bf16), with the same optimizer
    and schedule: every loss and held-out metric of DDP's fp32 all-reduce equals DeepSpeed's bit for bit, and those
    of DeepSpeed's bf16 communication equal DDP's bf16 hook's. So the long tasks train one of each pair on loopback
    (``fidelity.SAME_CURVE``); the other's step time on the cluster is its own."""
    meta, _ = _run(tmp_path, "ds_dense,ddp_dense,ddp_bf16,ds_bf16")
    keys = ("loss", "lr", "eval/top1", "eval/loss")

    def curve(system: str) -> list[list]:
        assert meta["systems"][system]["returncode"] == 0
        path = tmp_path / "out" / "systems" / system / "steps.jsonl"
        return [[r.get(k) for k in keys] for r in map(json.loads, path.read_text().splitlines()) if r]

    assert any(row[2] is not None for row in curve("ds_dense"))
    assert curve("ddp_dense") == curve("ds_dense")
    assert curve("ds_bf16") == curve("ddp_bf16") != curve("ds_dense")
