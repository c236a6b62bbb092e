"""Per-step records: the last_stats() keys, the JSON-lines sink (rank 0, or per rank with {rank}), log_interval,
and static mode's gain measured every gain_interval-th step only."""
from __future__ import annotations

import json
import os

import models as M
from harness import run_ranks

REQUIRED = {"step", "mode", "branch", "cf", "wire_cf", "bytes_sent", "dense_bytes", "values_sent", "compress_s",
            "decompress_s", "comm_wait_s"}


def _job(rank: int, world: int, out: str) -> dict:
    import ds_gravac
    gravac = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 1000, "log_interval": 2,
              "gain_interval": 4, "telemetry": {"jsonl": os.path.join(out, "steps_{rank}.jsonl")}}
    model = M.make_model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(gravac))
    M.train(engine, rank, 5)
    handle = ds_gravac.get_handle(engine)
    popped = handle.pop_stats()
    handle.detach()
    gains = {r["step"]: v for r in popped for k, v in r.items() if k.startswith("gain_raw@")}
    return {"last": handle.last_stats(), "popped": len(popped), "flag": engine.enable_backward_allreduce,
            "gains": gains}


def test_last_stats_and_jsonl(tmp_path) -> None:
    results = run_ranks(_job, 2, str(tmp_path))
    for rank, res in enumerate(results):
        assert REQUIRED <= set(res["last"]), REQUIRED - set(res["last"])
        assert res["last"]["step"] == 4 and res["popped"] == 5
        assert res["flag"] is True, "detach gives gradient averaging back to DeepSpeed"
        lines = [json.loads(line) for line in open(tmp_path / f"steps_{rank}.jsonl", encoding="utf-8")]
        assert [rec["step"] for rec in lines] == [0, 2, 4]
        assert lines[0]["branch"] == "dense" and lines[-1]["branch"] == "cand"
        assert lines[-1]["bytes_sent"] < lines[-1]["dense_bytes"]
        assert list(res["gains"]) == [4], "static mode measures its level's gain on steps 4, 8, … only"
        assert 0.0 < res["gains"][4] <= 1.0 + 1e-9, "Top-k's share of the compensated gradient's energy"
        assert "gain_raw@10" in lines[-1] and "gain_raw@10" not in lines[1]
