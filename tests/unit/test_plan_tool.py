"""``python -m ds_gravac.plan``, run as a user runs it (a subprocess): its bytes against formulas derived from the
documented payload formats, dense's ratio, attach's refusals word for word, and one-line errors for bad input."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torchvision

from ds_gravac.config import GravacConfig, parse_config
from ds_gravac.errors import GravacConfigError, GravacUnsupportedError
from ds_gravac.integration.build import build_compressor, reject_unimplemented
from ds_gravac.integration.engine import check_compressible
from ds_gravac.integration.zero import validate_zero

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "ds_configs" / "default.json"


def tool_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds_gravac.plan", *args], cwd=ROOT, env=tool_env(),
                          capture_output=True, text=True, timeout=600)


def as_zero3(config: dict) -> dict:
    """The engine part of a ZeRO-3 config the planning process can build."""
    config = {**config, "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
    del config["scheduler"]       # torch's MultiStepLR does not take DeepSpeed's stage-3 optimizer wrapper
    return config


def _with_section(tmp_path: Path, section: dict, **engine: object) -> Path:
    config = {**json.loads(DEFAULT.read_text()), **engine, "gravac": section}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _report(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout[out.stdout.index("{\n"):])      # after DeepSpeed's build lines, if any


def qsgd8_bytes(numel: int, n: int) -> float:
    """QSGD at 8 bits (docs/algorithms.md, compress/qsgd.py): a bucket is cut into N partitions of L = ceil(m/N)
    values, each sent as fp32 norms, one per block of 128, and 8-bit codes packed four to a 32-bit word. Two ranks
    all-gather the N partition payloads ((N-1)·P bytes per rank); more ranks use the parameter server, an
    all-to-all and an all-gather of one partition's payload each (2(N-1)·P/N)."""
    part = math.ceil(numel / n)
    words = math.ceil(part / 128) + math.ceil(part * 8 / 32)
    payload = 4 * n * words
    return (n - 1) * payload if n == 2 else 2 * (n - 1) * payload / n


def test_the_default_config_plans_autos_reference() -> None:
    """``"gravac": {}`` is ``auto`` over PowerSGD on tensors of at least 16,384 values since 0.5: the same plan as
    the section written out."""
    report = _report(plan(str(DEFAULT), "--model", "resnet18", "--json"))
    assert (report["mode"], report["compressor"], report["refusals"]) == ("auto", "powersgd", [])
    assert {r["level"] for r in report["rows"] if r["family"] == "powersgd"} == {"rank 16"}


def test_static_qsgd_bytes_follow_the_qsgd_format(tmp_path: Path) -> None:
    world = 2
    out = plan(str(_with_section(tmp_path, {"mode": "static"})), "--model", "resnet18", "--world-size", str(world),
               "--json")
    report = _report(out)
    model = torchvision.models.resnet18(weights=None)
    numel = sum(p.numel() for p in model.parameters())
    assert report["refusals"] == [] and report["mode"] == "static" and report["compressor"] == "qsgd"
    assert sum(r["numel"] for r in report["rows"]) == numel
    assert sum(r["tensors"] for r in report["rows"]) == len(list(model.parameters()))
    for row in report["rows"]:
        assert row["family"] == "qsgd" and row["level"] == "8-bit (CF 4)"
        assert row["exchange"] == ("allgather" if world == 2 else "casync_ps")
        assert row["bytes_sent"] == qsgd8_bytes(row["numel"], world)
        assert row["dense_bytes"] == 2 * (world - 1) / world * 4 * row["numel"]      # fp32 ring all-reduce
    assert report["dense_bytes"] == 2 * (world - 1) / world * 4 * numel
    assert report["ratio"] == pytest.approx(report["bytes_sent"] / report["dense_bytes"], rel=1e-12)
    assert 0.25 < report["ratio"] < 0.27
    # the nominal link's α–β line: every bucket sends dense as one all-reduce of 4·m bytes
    beta = 2 * (world - 1) / world * 8 / 1e9
    assert report["predicted_dense_s"] == pytest.approx(sum(1e-3 + beta * 4 * r["numel"] for r in report["rows"]))
    assert report["predicted_s"] < report["predicted_dense_s"]


def test_auto_plans_show_its_reference_rank_16(tmp_path: Path) -> None:
    """``auto`` over PowerSGD: the plan shows its reference, rank 16 on every tensor of at least 16,384 values (P
    and Q factors, ``4·16·(n + m)`` bytes for an ``n × m`` matrix view), the rest dense in bf16 (2 bytes a value);
    at two ranks a rank sends what it all-reduces. (It showed the all-dense first rung, which says nothing.)"""
    section = {"mode": "auto", "compressor": "powersgd", "min_compress_numel": 16384}
    report = _report(plan(str(_with_section(tmp_path, section)), "--model", "resnet18", "--json"))
    expected = 0.0
    for p in torchvision.models.resnet18(weights=None).parameters():
        n = p.shape[0]
        expected += 4 * 16 * (n + p.numel() // n) if p.numel() >= 16384 else 2 * p.numel()
    assert (report["mode"], report["compressor"], report["refusals"]) == ("auto", "powersgd", [])
    assert report["bytes_sent"] == expected
    assert {r["level"] for r in report["rows"] if r["family"] == "powersgd"} == {"rank 16"}
    assert "reference plan" in report["start"]


def test_an_unsupported_engine_is_refused_without_knock_on_refusals(tmp_path: Path) -> None:
    """Under ZeRO-3 every tensor is partitioned to nothing on the planning process; the checks after the engine's
    would only add refusals that follow from it ("no compressed tensor")."""
    path = _with_section(tmp_path, {"mode": "auto", "compressor": "powersgd", "min_compress_numel": 16384})
    path.write_text(json.dumps(as_zero3(json.loads(path.read_text()))))
    out = plan(str(path), "--model", "resnet18")
    assert out.returncode == 2, out.stdout + out.stderr
    refused = out.stdout.split("refused at attach (1):\n", 1)[1].splitlines()
    assert len(refused) == 1 and "zero_optimization.stage 3 is not supported" in refused[0]


def test_the_tool_exits_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """Regression (CI, stop 76): under ZeRO-3 about one run in ten aborted at exit (-6) after printing a correct
    report, when a gloo run-loop thread of the throwaway engine asked for the GIL during finalization. The tool now
    exits once the report is flushed: an atexit handler (which runs only if finalization does) never fires, and the
    report and its status are whole."""
    path = _with_section(tmp_path, {"mode": "static"})
    path.write_text(json.dumps(as_zero3(json.loads(path.read_text()))))
    marker = tmp_path / "finalized"
    script = (f"import atexit, pathlib, runpy, sys\n"
              f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'finalized')\n"
              f"sys.argv = ['ds_gravac.plan', {str(path)!r}, '--model', 'resnet18']\n"
              f"runpy.run_module('ds_gravac.plan', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=tool_env(), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "refused at attach (1):" in out.stdout and "stage 3 is not supported" in out.stdout
    assert not marker.exists()


def test_a_hugging_face_model_given_as_module_callable(tmp_path: Path) -> None:
    """The HF BERT example (``module:callable``): every trainable tensor planned, bytes at QSGD 8-bit's ratio."""
    from runners.train_hf import tiny_bert

    config = {**json.loads((ROOT / "ds_configs" / "hf.json").read_text()), "gravac": {"mode": "static"}}
    path = tmp_path / "hf_static.json"
    path.write_text(json.dumps(config))
    report = _report(plan(str(path), "--model", "runners.train_hf:tiny_bert", "--json"))
    assert sum(r["numel"] for r in report["rows"]) == sum(p.numel() for p in tiny_bert().parameters())
    assert report["refusals"] == [] and 0.25 < report["ratio"] < 0.27


def test_dense_config_reads_ratio_one() -> None:
    out = plan(str(ROOT / "ds_configs" / "dense.json"), "--model", "resnet18", "--rate", "100mbit")
    assert out.returncode == 0, out.stderr
    total = next(line for line in out.stdout.splitlines() if line.lstrip().startswith("total"))
    assert total.split()[-1] == "1.000"
    assert "compression ratio: 1.000 of dense's bytes" in out.stdout
    assert "nominal link 100 Mbit/s" in out.stdout and "refusals: none" in out.stdout
    assert "Traceback" not in out.stderr


def _expected_refusals(case: str, cfg: GravacConfig) -> list[str]:
    """attach's messages for the case, from the library's own checks."""
    with pytest.raises(GravacUnsupportedError) as unimplemented:
        reject_unimplemented(cfg)
    if case == "zero3":
        with pytest.raises(GravacUnsupportedError) as zero:
            validate_zero(SimpleNamespace(zero_optimization_stage=lambda: 3))   # it reads the stage first
        return [str(unimplemented.value), str(zero.value)]
    named = list(torchvision.models.resnet18(weights=None).named_parameters())
    with pytest.raises(GravacConfigError) as nothing_compressed:
        check_compressible(cfg, build_compressor(cfg), named)
    return [str(unimplemented.value), str(nothing_compressed.value)]


@pytest.mark.parametrize("case", ["accordion", "zero3"])
def test_refusals_are_attach_messages_and_exit_two(case: str, tmp_path: Path) -> None:
    config = json.loads(DEFAULT.read_text())
    section: dict = {"decision_source": "rank0"}
    if case == "zero3":
        config = as_zero3(config)
    else:
        section.update(mode="accordion", compressor="topk", accordion={"interval_steps": 10},
                       min_compress_numel=10**9)
    config["gravac"] = section
    path = tmp_path / "refused.json"
    path.write_text(json.dumps(config))
    expected = _expected_refusals(case, parse_config(section))
    out = plan(str(path), "--model", "resnet18")
    assert out.returncode == 2, out.stdout + out.stderr
    refused = out.stdout.split("refused at attach (2):\n", 1)[1].splitlines()
    assert refused == [f"  {msg}" for msg in expected]
    params = sum(p.numel() for p in torchvision.models.resnet18(weights=None).parameters())
    assert f"model resnet18 ({params:,} parameters)" in out.stdout      # counted before ZeRO-3 partitions them
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, says", [
    ((str(DEFAULT), "--model", "resnet_nonexistent"), "--model 'resnet_nonexistent' is neither a torchvision model "
     "name (e.g. resnet101) nor module:callable"),
    ((str(DEFAULT), "--model", "no_such_module:build"), "--model 'no_such_module:build': cannot import it"),
    ((str(DEFAULT), "--model", "resnet18", "--rate", "fast"), "--rate 'fast' is not a link rate"),
    ((str(DEFAULT), "--model", "resnet18", "--world-size", "1"), "--world-size 1: must be >= 2"),
    ((str(ROOT / "no_such.json"), "--model", "resnet18"),
     f"cannot read the config '{ROOT / 'no_such.json'}': No such file or directory"),
])
def test_bad_input_is_one_line_and_exit_two(args: tuple[str, ...], says: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (the same ``main``; it fails before any engine or process group exists)."""
    from ds_gravac.plan.__main__ import main
    assert main(list(args)) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith(f"ds_gravac.plan: {says}"), err
