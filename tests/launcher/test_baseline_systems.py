"""The baselines users pick instead of compression, as benchmark systems on loopback (tiny_cnn, 4 steps, the real
launchers): DeepSpeed with 16-bit communication, DDP with torch's bf16 hook, torch's post-local SGD. Each writes the
step records the fidelity report compares (loss, time per step, bytes per step, held-out top-1), and every system
follows the runner's learning-rate schedule and evaluation options (a finer final evaluation included). All systems
train once, in two invocations of ``bench_e2e run`` into one directory (a table made in two invocations)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher

STEPS = 4
SCHEDULE = ("--lr-warmup", "3", "--lr-decay-at", "0.75")      # factors 1/3, 2/3, 1, 0.1 for steps 0..3
FIRST = ("ds_dense", "ddp_dense")
SECOND = ("ddp_bf16", "ds_bf16", "ds_fp16", "ddp_localsgd@period=2@start=1")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every system of this file trained once: the dense pair, then the others in a second invocation."""
    from ds_gravac_bench.e2e import main

    out = tmp_path_factory.mktemp("baselines") / "run"      # beside it: the first invocation's records
    extra = " ".join((*SCHEDULE, "--eval-every", "2", "--eval-batches", "2", "--final-eval-batches", "3"))
    common = ["run", "--model", "tiny_cnn", "--rate", "loopback", "--steps", str(STEPS), "--micro-batch", "8",
              "--timeout", "240", f"--runner-extra={extra}", "--out", str(out)]
    main([*common, "--systems", ",".join(FIRST)])
    (out.parent / "first_systems.json").write_text(json.dumps(json.loads((out / "meta.json").read_text())["systems"]))
    main([*common, "--systems", ",".join(SECOND)])
    return out


def _run(out: Path, system: str) -> tuple[dict, list[dict]]:
    """The directory's meta.json and ``system``'s step records (it must have finished)."""
    meta = json.loads((out / "meta.json").read_text())
    recs = [json.loads(x) for x in (out / "systems" / system / "steps.jsonl").read_text().splitlines() if x.strip()]
    assert meta["systems"][system]["returncode"] == 0, (out / "systems" / system / "log.txt").read_text()[-3000:]
    return meta, recs


def test_a_second_invocation_into_a_directory_keeps_the_first_ones_systems(out: Path) -> None:
    """A step-time table made in two invocations into one directory: meta.json must keep the first invocation's
    systems, or every report reading it loses them while their steps stay on disk (it did, without
    --checkpoint-every)."""
    systems = json.loads((out / "meta.json").read_text())["systems"]
    assert set(systems) == {*FIRST, *SECOND}
    assert all(m["returncode"] == 0 for m in systems.values())
    first = json.loads((out.parent / "first_systems.json").read_text())
    assert {sid: systems[sid] for sid in FIRST} == first         # each record exactly as its invocation wrote it


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
def test_sixteen_bit_baselines_send_half_of_fp32(out: Path, system: str) -> None:
    meta, recs = _run(out, system)
    ring = _ring_bytes()
    assert meta["systems"][system]["family"] == "baseline"
    assert all(r["bytes_sent"] == pytest.approx(ring / 2) and r["dense_bytes"] == pytest.approx(ring) for r in recs)
    _check_records(recs, meta["lr"])
    if system.startswith("ds_"):
        cfg = json.loads((out / "configs" / f"{system}.json").read_text())
        assert cfg["communication_data_type"] == system[3:] and "gravac" not in cfg


def test_post_local_sgd_sends_on_sync_and_averaging_steps_only(out: Path) -> None:
    """Start 1, period 2: step 0 all-reduces gradients, steps 1 and 3 average the parameters, step 2 is local."""
    meta, recs = _run(out, SECOND[-1])
    ring = _ring_bytes()
    assert [r["bytes_sent"] for r in recs] == pytest.approx([ring, ring, 0.0, ring])
    _check_records(recs, meta["lr"])


def test_ddp_and_deepspeed_train_bitwise_alike_at_two_ranks(out: Path) -> None:
    """At two ranks both sum two gradients and halve them exactly (in fp32, or both in bf16), with the same optimizer
    and schedule: every loss and held-out metric of DDP's fp32 all-reduce equals DeepSpeed's bit for bit, and those
    of DeepSpeed's bf16 communication equal DDP's bf16 hook's. So the long tasks train one of each pair on loopback
    (``fidelity.SAME_CURVE``); the other's step time on the cluster is its own."""
    meta = json.loads((out / "meta.json").read_text())
    keys = ("loss", "lr", "eval/top1", "eval/loss")

    def curve(system: str) -> list[list]:
        assert meta["systems"][system]["returncode"] == 0
        path = out / "systems" / system / "steps.jsonl"
        return [[r.get(k) for k in keys] for r in map(json.loads, path.read_text().splitlines()) if r]

    assert any(row[2] is not None for row in curve("ds_dense"))
    assert curve("ddp_dense") == curve("ds_dense")
    assert curve("ds_bf16") == curve("ddp_bf16") != curve("ds_dense")
