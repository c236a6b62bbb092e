"""The MKL vendor shim builds, MKL then takes an Intel kernel path on any x86 CPU, and a run records the preload."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

needs_cc = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler to build with")

# MKL_VERBOSE's banner names the code path MKL dispatched to; on a CPU it does not take for Intel's it names no
# instruction set ("Intel(R) Architecture processors"), whatever the CPU supports.
PROBE = "import torch; torch.ones(64, 64) @ torch.ones(64, 64)"


def _banner(preload: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(MKL_VERBOSE="1", OMP_NUM_THREADS="1")
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("MKL_VERBOSE oneMKL"))


@needs_cc
def test_the_shim_answers_intel_to_mkls_vendor_question(tmp_path: Path) -> None:
    from ds_gravac_bench.mkl_vendor import LIBRARY, build

    lib = build(tmp_path)
    assert lib == (tmp_path / LIBRARY).resolve() and lib.is_file()
    shim = ctypes.CDLL(str(lib))
    assert shim.mkl_serv_intel_cpu_true() == 1 and shim.mkl_serv_intel_cpu() == 1
    if "x86_64" not in os.uname().machine:
        pytest.skip("MKL runs on x86 only")
    banner = _banner(str(lib))
    assert "Intel(R) Architecture processors" not in banner, f"MKL still takes its generic path: {banner}"
    assert "Intel(R) A" in banner and ("AVX" in banner or "SSE" in banner), banner


def test_a_run_records_the_preloaded_library_by_name_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from ds_gravac_bench.e2e import ISA_CAPS, env_block

    for key in ISA_CAPS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/some/where/libmkl_as_intel.so:/else/libx.so")
    assert env_block()["isa_caps"] == {"LD_PRELOAD": "libmkl_as_intel.so libx.so"}
    monkeypatch.delenv("LD_PRELOAD")
    assert "isa_caps" not in env_block()
