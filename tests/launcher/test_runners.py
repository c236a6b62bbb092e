"""The runners under the real launchers (`deepspeed --num_gpus 2`, `torchrun`), 2 CPU ranks, tiny models.

One uninterrupted 6-step run under the deepspeed launcher is shared by several tests (summary, steps.jsonl, wandb
offline files); a torchrun resume of its step-3 checkpoint must reproduce its last three steps exactly.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from typing import Any, Iterator

import pytest
import torch

from ds_gravac.integration.ports import free_port
from ds_gravac_bench.systems import system_matrix

pytestmark = pytest.mark.launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
CIFAR = "runners/train_cifar.py"
PTB = "runners/train_ptb.py"
TINY_CIFAR = ["--model", "tiny_cnn", "--eval-batches", "2", "--no-progress"]


def launch(args: list[str], launcher: str = "deepspeed", timeout: float = 240,
           check: bool = True) -> subprocess.CompletedProcess:
    """A real 2-rank launch with the supported environment; never touches the network (wandb offline)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline", WANDB_SILENT="true")
    port = str(free_port())
    if launcher == "deepspeed":
        cmd = [os.path.join(BIN, "deepspeed"), "--master_port", port, "--num_gpus", "2"]
    else:
        cmd = [os.path.join(BIN, "torchrun"), "--nproc_per_node", "2", "--master_port", port]
    proc = subprocess.run(cmd + args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def single(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """One rank without a launcher (a world of 1): for what a runner checks before or without its peers."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline", RANK="0",
               LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return subprocess.run([sys.executable] + args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _write_config(path: str, source: str, **gravac: Any) -> str:
    with open(os.path.join(ROOT, "ds_configs", source), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["gravac"].update(gravac)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return path


def _jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Static Top-k 10x with a threshold low enough that tiny_cnn's weights are compressed (residuals != 0)."""
    d = str(tmp_path_factory.mktemp("runners"))
    cfg = _write_config(os.path.join(d, "tiny_topk.json"), "bench/resnet101_topk_10x.json", min_compress_numel=1000,
                        bucket_cap_mb=0.01)
    return {"dir": d, "config": cfg}


@pytest.fixture(scope="module")
def full(work: dict) -> dict:
    d = os.path.join(work["dir"], "full")
    proc = launch([CIFAR, "--deepspeed_config", work["config"], "--micro-batch", "8", "--steps", "6",
                   "--eval-every", "3", "--log-dir", os.path.join(d, "log"), "--save-dir", os.path.join(d, "ckpt"),
                   "--save-every", "3", "--run-name", "full-run"] + TINY_CIFAR)
    return {"dir": d, "proc": proc}


@pytest.fixture(scope="module")
def resumed(work: dict, full: dict) -> dict:
    """The uninterrupted run's step-3 checkpoint alone in a directory (a run stopped there), resumed under torchrun
    up to step 6."""
    d = os.path.join(work["dir"], "resume")
    shutil.copytree(os.path.join(full["dir"], "ckpt", "step3"), os.path.join(d, "a", "step3"))
    with open(os.path.join(d, "a", "latest"), "w", encoding="utf-8") as f:
        f.write("step3")
    rest = launch([CIFAR, "--deepspeed_config", work["config"], "--micro-batch", "8", "--eval-every", "3",
                   "--no-wandb", "--steps", "6", "--resume", os.path.join(d, "a"), "--log-dir",
                   os.path.join(d, "log_b"), "--save-dir", os.path.join(d, "b")] + TINY_CIFAR, launcher="torchrun")
    return {"dir": d, "rest": rest}


def test_cifar_summary_and_steps_jsonl(full: dict) -> None:
    out = full["proc"].stdout
    assert "== train_cifar summary: system gravac, model tiny_cnn, 2 ranks" in out
    assert re.search(r"steps: 6 \(optimizer steps 1\.\.6\)", out)
    assert "gradient_clipping 0" in out
    assert re.search(r"CF timeline .*dense@1x x1 \[1-1\], cand@10x x5 \[2-6\]", out)
    assert re.search(r"bytes sent [\d.]+ MB vs dense [\d.]+ MB \(([\d.]+)x less\)", out)
    assert re.search(r"eval at step 6: eval/loss [\d.]+, eval/top1 [\d.]+, eval/top5 [\d.]+", out)
    records = _jsonl(os.path.join(full["dir"], "log", "steps.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "lr", "time/step", "samples_per_s", "time/compute_est", "cf", "cf_sent", "branch",
                "branch_code", "bytes_sent", "dense_bytes", "compress_s", "comm_wait_s", "gravac/theta_c"):
        assert key in records[-1], key
    assert records[0]["branch"] == "dense" and records[-1]["bytes_sent"] < records[-1]["dense_bytes"]
    assert "eval/top1" in records[2] and "eval/top5" in records[5] and "eval/top1" not in records[3]


def _wandb_records(path: str) -> Iterator[Any]:
    """Records of an offline ``.wandb`` file (LevelDB-style log: 7-byte header, 32 KiB blocks, chunked records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:4] == b":W&B"
    pos, buf, block = 7, b"", 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        buf = data if kind in (1, 2) else buf + data
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def test_wandb_offline_run_holds_the_logged_metrics(full: dict) -> None:
    runs = glob.glob(os.path.join(full["dir"], "log", "wandb", "offline-run-*"))
    assert len(runs) == 1, runs
    assert f"wandb sync {runs[0]}" in full["proc"].stdout
    history, config = [], {}
    for rec in _wandb_records(glob.glob(os.path.join(runs[0], "run-*.wandb"))[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in rec.history.item})
        elif kind == "run":
            config.update({item.key: json.loads(item.value_json) for item in rec.run.config.update})
    assert [h["_step"] for h in history] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "lr", "samples_per_s", "cf", "branch_code", "bytes_sent", "dense_bytes", "time/compute_est",
                "time/comm_wait", "gravac/theta_c"):
        assert key in history[-1], key
    assert "eval/top1" in history[2] and "eval/top5" in history[5]
    assert config["deepspeed_config"]["gravac"]["min_compress_numel"] == 1000
    assert config["args"]["system"] == "gravac"


def _module(path: str) -> dict:
    return torch.load(os.path.join(path, "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False)["module"]


def _residuals(path: str) -> dict:
    """A per-rank file's error-feedback residuals, by parameter name."""
    return torch.load(path, weights_only=False)["memory"]["slots"]["residual"]


def test_resume_reproduces_the_uninterrupted_run(full: dict, resumed: dict) -> None:
    assert "resumed at step 3" in resumed["rest"].stdout
    a = os.path.join(resumed["dir"], "a", "step3")
    for rank in (0, 1):
        saved = _residuals(os.path.join(a, f"gravac_rank{rank:05d}.pt"))
        assert any(bool(t.abs().sum() > 0) for t in saved.values()), "resume must carry residuals"
    b, c = os.path.join(resumed["dir"], "b", "step6"), os.path.join(full["dir"], "ckpt", "step6")
    mb, mc = _module(b), _module(c)
    assert mb.keys() == mc.keys() and all(torch.equal(mb[k], mc[k]) for k in mb)
    for rank in (0, 1):
        rb = _residuals(os.path.join(b, f"gravac_rank{rank:05d}.pt"))
        rc = _residuals(os.path.join(c, f"gravac_rank{rank:05d}.pt"))
        assert rb.keys() == rc.keys() and all(torch.equal(rb[k], rc[k]) for k in rc)
    full_losses = [r["loss"] for r in _jsonl(os.path.join(full["dir"], "log", "steps.jsonl"))]
    rest = [r["loss"] for r in _jsonl(os.path.join(resumed["dir"], "log_b", "steps.jsonl"))]
    assert rest == full_losses[3:], "torchrun and the deepspeed launcher see the same data stream"


def test_train_ptb_tiny_lstm(tmp_path: Any) -> None:
    with open(os.path.join(ROOT, "ds_configs", "bench", "lstm_gravac_exp.json"), encoding="utf-8") as f:
        controller = json.load(f)["gravac"]["gravac"]
    cfg = _write_config(str(tmp_path / "lstm.json"), "bench/lstm_gravac_exp.json",
                        gravac={**controller, "window": 4, "refresh_steps": 1, "min_sent_steps": 1, "theta_min": 2,
                                "theta_max": 100})
    proc = launch([PTB, "--deepspeed_config", cfg, "--lstm-size", "tiny", "--vocab-size", "500",
                   "--synthetic-tokens", "40000", "--steps", "12", "--eval-every", "6", "--eval-batches", "5",
                   "--no-wandb", "--no-progress", "--log-dir", str(tmp_path / "log")])
    out = proc.stdout
    assert "== train_ptb summary: system gravac, model lstm, 2 ranks" in out
    assert re.search(r"eval at step 12: eval/loss [\d.]+, eval/ppl [\d.]+", out)
    assert re.search(r"GraVAC candidates \(theta_c x steps \[first-last\]\): 4x", out)
    records = _jsonl(str(tmp_path / "log" / "steps.jsonl"))
    assert len(records) == 12 and "tokens_per_s" in records[0] and "eval/ppl" in records[5]


PLAIN = [CIFAR, "--micro-batch", "8", "--steps", "3", "--system", "deepspeed", "--no-wandb", "--eval-every", "-1"]


@pytest.fixture(scope="module")
def plain(work: dict) -> dict:
    """DeepSpeed's own exchange through the runners' loop, 3 steps (torchrun: the launcher is not what is tested)."""
    d = os.path.join(work["dir"], "plain")
    proc = launch(PLAIN + ["--deepspeed_config", work["config"], "--log-dir", d] + TINY_CIFAR, launcher="torchrun")
    return {"dir": d, "proc": proc}


def test_plain_deepspeed_shares_the_loop(plain: dict, full: dict) -> None:
    assert "== train_cifar summary: system deepspeed, model tiny_cnn" in plain["proc"].stdout
    records = _jsonl(os.path.join(plain["dir"], "steps.jsonl"))
    reference = _jsonl(os.path.join(full["dir"], "log", "steps.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[0]["loss"] == reference[0]["loss"], "same initial weights and first batch for every system"
    assert all(k in records[0] for k in ("loss", "lr", "time/step", "samples_per_s", "bytes_sent"))


def test_grad_jitter_perturbs_only_after_the_first_backward(work: dict, plain: dict, tmp_path: Any) -> None:
    """--grad-jitter multiplies the averaged gradients before each optimizer step: step 1's loss (computed before
    any update) is DeepSpeed dense's exactly, the next ones differ from it (at 0.1, the largest allowed: on tiny_cnn
    a smaller jitter moves the loss by less than float32 resolves), and only slightly."""
    launch(PLAIN + ["--deepspeed_config", work["config"], "--grad-jitter", "0.1", "--log-dir", str(tmp_path / "jitter")]
           + TINY_CIFAR, launcher="torchrun")
    jitter = [r["loss"] for r in _jsonl(str(tmp_path / "jitter" / "steps.jsonl"))]
    plain = [r["loss"] for r in _jsonl(os.path.join(plain["dir"], "steps.jsonl"))]
    assert jitter[0] == plain[0]
    assert jitter[1:] != plain[1:]
    assert all(abs(j / p - 1) < 1e-2 for j, p in zip(jitter, plain))


def test_grad_jitter_is_refused_under_zero(work: dict, tmp_path: Any) -> None:
    """ZeRO keeps its gradients out of ``p.grad``: the jitter would silently do nothing, so it is refused (on
    every rank alike, from the config alone: one rank shows it)."""
    with open(work["config"], encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["zero_optimization"] = {"stage": 1}
    path = tmp_path / "zero1.json"
    path.write_text(json.dumps(cfg))
    proc = single([CIFAR, "--deepspeed_config", str(path), "--micro-batch", "8", "--steps", "1", "--system",
                   "deepspeed", "--no-wandb", "--grad-jitter", "1e-6", "--log-dir", str(tmp_path / "log")]
                  + TINY_CIFAR)
    assert proc.returncode != 0
    assert "--grad-jitter needs ZeRO stage 0; this config has stage 1" in proc.stdout + proc.stderr


@pytest.mark.parametrize("system", ["local", "local_engine"])
def test_local_system_trains_alone(system: str, work: dict, tmp_path: Any) -> None:
    """`--system local`/`local_engine` (the benchmarks' compute-only rows) run one rank without communication."""
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline",
               RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    proc = subprocess.run([sys.executable, CIFAR, "--deepspeed_config", work["config"], "--micro-batch", "8",
                           "--steps", "3", "--system", system, "--no-wandb", "--log-dir", str(tmp_path / "log")]
                          + TINY_CIFAR, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = _jsonl(str(tmp_path / "log" / "steps.jsonl"))
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["bytes_sent"] == 0 for r in records)
    assert all(0 < r["loss"] < 10 for r in records)     # one rank reads the whole stream: other batches
    for leaked in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{port}_*"):   # DeepSpeed's, not ours
        os.unlink(leaked)


def _powersgd_values(rank: int) -> tuple[float, float]:
    """Ring all-reduce bytes per rank (N = 2) for tiny_cnn dense, and for the values PowerSGD sends: per
    parameter viewed as shape[0] x rest, factors (n + m)·r when that is < n·m / 2 (min_compression_rate 2)."""
    from runners.models import build_model

    dense = factors = 0
    for p in build_model("tiny_cnn").parameters():
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, rank)
        dense += p.numel()
        factors += (n + m) * r if (n + m) * r * 2 < n * m else p.numel()
    return dense * 4.0, factors * 4.0      # 2(N-1)/N = 1 at N = 2


def test_ddp_powersgd_runs_and_resumes_exactly(work: dict, full: dict, tmp_path: Any) -> None:
    """PowerSGD starts at iteration 10; its error memory follows DDP's rebuilt bucket layout across a resume (torchrun,
    DDP's own launcher)."""
    common = [CIFAR, "--deepspeed_config", work["config"], "--micro-batch", "8", "--system", "ddp_powersgd",
              "--no-wandb", "--eval-every", "-1"] + TINY_CIFAR
    whole = launch(common + ["--steps", "13", "--save-dir", str(tmp_path / "c"), "--save-every", "11",
                             "--log-dir", str(tmp_path / "lc")], launcher="torchrun")
    assert "== train_cifar summary: system ddp_powersgd, model tiny_cnn" in whole.stdout
    records = _jsonl(str(tmp_path / "lc" / "steps.jsonl"))
    assert records[0]["loss"] == _jsonl(os.path.join(full["dir"], "log", "steps.jsonl"))[0]["loss"]
    ring, factors = _powersgd_values(rank=4)
    # what the benchmark records as the system's fp32 start (it prices those steps at the dense step) is what runs
    start = system_matrix(13)["ddp_powersgd"].dense_start
    assert all(r["bytes_sent"] == r["dense_bytes"] == ring for r in records[:start]), "vanilla all-reduce first"
    assert start == 10 and records[start]["bytes_sent"] < ring / 2
    assert records[-1]["bytes_sent"] == pytest.approx(factors) and factors < ring / 2
    # the uninterrupted run's step-11 checkpoint, alone in a directory whose "latest" names it: a run stopped there
    shutil.copytree(tmp_path / "c" / "step11", tmp_path / "a" / "step11")
    (tmp_path / "a" / "latest").write_text("step11")
    launch(common + ["--steps", "13", "--resume", str(tmp_path / "a"), "--save-dir", str(tmp_path / "b"),
                     "--log-dir", str(tmp_path / "lb")], launcher="torchrun")
    saved = torch.load(str(tmp_path / "a" / "step11" / "runner_rank00001.pt"), weights_only=False)
    assert saved["system"]["powersgd"]["error_dict"], "PowerSGD error memory is saved per rank"
    b = torch.load(str(tmp_path / "b" / "step13" / "ddp_checkpoint.pt"), weights_only=False)["module"]
    c = torch.load(str(tmp_path / "c" / "step13" / "ddp_checkpoint.pt"), weights_only=False)["module"]
    assert all(torch.equal(b[k], c[k]) for k in c)


def test_missing_cifar_files_give_a_clear_error(tmp_path: Any) -> None:
    """Read before any distributed work (every rank alike), so one rank shows it."""
    proc = single([CIFAR, "--deepspeed_config", "ds_configs/resnet101_dense.json", "--dataset", "cifar10",
                   "--data-dir", str(tmp_path / "nothing"), "--steps", "1", "--no-wandb",
                   "--log-dir", str(tmp_path / "log")] + TINY_CIFAR, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert "error: cifar10 files not found" in out and "--download" in out and "--dataset synthetic" in out
    assert "Traceback" not in out


def test_deepspeed_wandb_monitor_is_refused(tmp_path: Any) -> None:
    """Checked before any distributed work, so a plain single-process start shows it."""
    cfg_path = str(tmp_path / "monitor.json")
    with open(os.path.join(ROOT, "ds_configs", "resnet101_dense.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["wandb"] = {"enabled": True, "project": "x"}
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", WANDB_MODE="offline")
    proc = subprocess.run([sys.executable, CIFAR, "--deepspeed_config", cfg_path, "--log-dir", str(tmp_path / "l")]
                          + TINY_CIFAR, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert 'enables its own "wandb" monitor' in proc.stderr and "--no-wandb" in proc.stderr
