"""``dense_bytes`` is what DeepSpeed's own gradient all-reduce sends in the same run, at the engine's communication
dtype: ``mode: "dense"`` reads 1.0 of it under fp32 and under ``"bf16": {"enabled": true}`` (ZeRO-0 and ZeRO-2),
and a 2-byte run is not credited with a 2x compression it did not make."""
from __future__ import annotations

from typing import Any

import pytest
import torch

import models as M
from harness import run_ranks

CASES = (("fp32", 0), ("bf16", 0), ("bf16", 2))


def _job(rank: int, world: int) -> dict:
    import ds_gravac

    out = {}
    for dtype, stage in CASES:
        bf16 = dtype == "bf16"
        model = M.make_model(seed=0)
        extra: dict[str, Any] = {"zero_allow_untested_optimizer": True} if stage else {}
        cfg = M.ds_config({"mode": "dense"}, bf16=bf16, world=world, **extra)
        cfg["zero_optimization"] = {"stage": stage}
        engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        M.train(engine, rank, 2, dtype=torch.bfloat16 if bf16 else None)
        records = ds_gravac.get_handle(engine).pop_stats()
        numel = sum(p.numel() for p in model.parameters())
        out[f"{dtype}-zero{stage}"] = {"records": [(r["bytes_sent"], r["dense_bytes"]) for r in records],
                                       "numel": numel}
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_job, 2)


@pytest.mark.parametrize("dtype, stage", CASES)
def test_dense_reads_one_whatever_the_dtype(results: list[dict], dtype: str, stage: int) -> None:
    width = 4 if dtype == "fp32" else 2                    # bytes per value DeepSpeed sends
    for res in results:
        case = res[f"{dtype}-zero{stage}"]
        ring = 2.0 * (2 - 1) / 2 * width * case["numel"]    # ring all-reduce, N = 2: 2(N-1)/N of the input
        assert case["records"] and all(sent == dense == ring for sent, dense in case["records"]), case
