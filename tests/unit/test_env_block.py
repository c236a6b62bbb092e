"""The environment a benchmark run records says which instruction-set caps picked its kernels."""
from __future__ import annotations

import pytest


def test_env_block_records_instruction_set_caps_only_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from ds_gravac_bench.e2e import ISA_CAPS, env_block

    for key in ISA_CAPS:
        monkeypatch.delenv(key, raising=False)
    assert "isa_caps" not in env_block()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert env_block()["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
