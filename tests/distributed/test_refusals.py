"""Set-ups ds_gravac cannot run correctly are refused clearly on every rank, before any optimizer step:
reentrant activation checkpointing, sparse embedding gradients, Accordion with nothing to compress, coerced
config types, and a 2-rank checkpoint resumed by a single (passive) rank."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import models as M
from harness import run_ranks

STATIC = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 1000, "bucket_cap_mb": 0.02}


class CheckpointedNet(nn.Module):
    """ThreeBucketNet's layers with torch.utils.checkpoint around the hidden stack (or the output layer)."""

    def __init__(self, reentrant: bool, where: str) -> None:
        super().__init__()
        self.base = M.make_model()
        self.reentrant, self.where = reentrant, where

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.base
        h = torch.relu(b.inp(x))

        def hidden(h: torch.Tensor) -> torch.Tensor:
            for layer in b.hidden:
                h = torch.relu(layer(h))
            return h
        if self.where == "middle":
            h = checkpoint(hidden, h, use_reentrant=self.reentrant)
            return b.out(b.norm(h))
        return checkpoint(lambda t: b.out(b.norm(t)), hidden(h), use_reentrant=self.reentrant)


def _outcome(fn) -> tuple[str, str]:
    try:
        return ("ok", repr(fn()))
    except Exception as exc:   # noqa: BLE001 - records the error every rank saw
        return (type(exc).__name__, str(exc))


def _checkpointing_job(rank: int, world: int) -> dict:
    import deepspeed

    import ds_gravac
    out = {}
    for reentrant in (True, False):
        for where in ("middle", "last"):
            def run() -> int:
                model = CheckpointedNet(reentrant, where)
                engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                                  config=M.ds_config(STATIC))
                M.train(engine, rank, 3)
                return int(engine.global_steps)
            out[(reentrant, where)] = _outcome(run)
    # non-reentrant checkpointing under mode "dense" is DeepSpeed's own averaging, bit for bit
    params = {}
    for system in ("deepspeed", "gravac"):
        model = CheckpointedNet(False, "middle")
        init = deepspeed.initialize if system == "deepspeed" else ds_gravac.initialize
        cfg = M.ds_config(None if system == "deepspeed" else {"mode": "dense", "bucket_cap_mb": 0.02})
        engine, *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
        M.train(engine, rank, 3)
        params[system] = M.params_of(engine)
    out["dense_parity"] = all(torch.equal(params["deepspeed"][k], params["gravac"][k]) for k in params["deepspeed"])
    return out


def test_reentrant_checkpointing_is_refused_and_non_reentrant_works() -> None:
    for res in run_ranks(_checkpointing_job, 2, timeout=200):
        for where in ("middle", "last"):
            kind, message = res[(True, where)]
            assert kind == "GravacUnsupportedError", (where, kind, message)
            assert "reentrant activation checkpointing" in message and "use_reentrant=False" in message
            assert res[(False, where)] == ("ok", "3"), res[(False, where)]
        assert res["dense_parity"]


class SparseEmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32, sparse=True)
        self.head = M.make_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb((x.abs() * 10).long().clamp(max=99)).mean(1))


def _attach_job(rank: int, world: int) -> dict:
    import deepspeed

    import ds_gravac
    out = {}

    def sparse() -> None:
        model = SparseEmbeddingNet()
        ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(STATIC))
    out["sparse"] = _outcome(sparse)
    for case, section in (("accordion_none", {"mode": "accordion", "compressor": "none",
                                              "accordion": {"interval_steps": 5}}),
                          ("accordion_threshold", {"mode": "accordion", "min_compress_numel": 10**9,
                                                   "accordion": {"interval_steps": 5}}),
                          ("string_cf", {"mode": "static", "cf": "10"}),
                          ("bool_cf", {"mode": "static", "cf": True}),
                          ("string_flag", {"enabled": "false"})):
        model = M.make_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config())
        out[case] = _outcome(lambda: ds_gravac.attach(engine, section))
        out[case + "_untouched"] = engine.enable_backward_allreduce
    return out


@pytest.fixture(scope="module")
def attach_results() -> dict:
    return run_ranks(_attach_job, 2, timeout=200)[0]


def test_sparse_embedding_refused_at_attach(attach_results: dict) -> None:
    kind, message = attach_results["sparse"]
    assert kind == "GravacUnsupportedError"
    assert "module 'emb' is Embedding(sparse=True)" in message


@pytest.mark.parametrize("case", ["accordion_none", "accordion_threshold"])
def test_accordion_with_nothing_compressible_refused_at_attach(attach_results: dict, case: str) -> None:
    kind, message = attach_results[case]
    assert kind == "GravacConfigError" and "mode 'accordion' needs at least one compressed tensor" in message
    assert attach_results[case + "_untouched"] is True


@pytest.mark.parametrize("case, key", [("string_cf", "cf"), ("bool_cf", "cf"), ("string_flag", "enabled")])
def test_types_are_not_coerced(attach_results: dict, case: str, key: str) -> None:
    kind, message = attach_results[case]
    assert kind == "GravacConfigError" and f"\n{key}\n" in message, message


def _save_job(rank: int, world: int, save_dir: str) -> None:
    import ds_gravac
    model = M.make_model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(STATIC))
    M.train(engine, rank, 3)
    ds_gravac.get_handle(engine).save_checkpoint(save_dir, tag="t")


def _single_rank_resume(rank: int, world: int, save_dir: str, policy: str) -> tuple[str, str, list]:
    import logging

    import ds_gravac
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())
    logging.getLogger("ds_gravac").addHandler(Grab())
    model = M.make_model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(
        {**STATIC, "checkpoint": {"on_world_size_change": policy}}, world=1))
    kind, message = _outcome(lambda: ds_gravac.get_handle(engine).load_checkpoint(save_dir, tag="t"))
    return kind, message, records


def test_single_rank_resume_of_a_two_rank_checkpoint_is_not_silent(tmp_path) -> None:
    run_ranks(_save_job, 2, str(tmp_path))
    kind, message, _ = run_ranks(_single_rank_resume, 1, str(tmp_path), "error")[0]
    assert kind == "GravacError" and "world_size=2, now 1" in message
    kind, _, logged = run_ranks(_single_rank_resume, 1, str(tmp_path), "reset")[0]
    assert kind == "ok" and any("world_size=2, now 1" in m and "reset" in m for m in logged), logged


def _refused_attach_job(rank: int, world: int) -> dict:
    """A refusal found after the compressor is built (DGC with tensors left dense) under ZeRO-2, where attach also
    takes the optimizer's own gradient hooks away: the engine must be exactly as before, and train as an engine
    that never met ds_gravac."""
    import deepspeed

    import ds_gravac
    cfg = M.ds_config({"mode": "static", "compressor": "dgc", "cf": 20, "min_compress_numel": 1000},
                      zero_optimization={"stage": 2}, zero_allow_untested_optimizer=True)
    engines = []
    for _ in range(2):
        model = M.make_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        engines.append(engine)
    engine, untouched = engines
    def hooks() -> dict[str, int]:
        return {n: len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
                for n, p in engine.module.named_parameters()}
    zero_hooks, before = len(engine.optimizer._grad_acc_hooks), hooks()
    outcome = _outcome(lambda: ds_gravac.attach(engine))
    hooked = [n for n, count in hooks().items() if count != before[n]]
    state = {"outcome": outcome, "zero_hooks": (zero_hooks, len(engine.optimizer._grad_acc_hooks)),
             "allreduce": engine.enable_backward_allreduce, "hooked": hooked,
             "handle": ds_gravac.get_handle(engine) is not None,
             "momentum": [g["momentum"] for g in engine.optimizer.optimizer.param_groups]}
    for e in (engine, untouched):
        M.train(e, rank, 2)
    a, b = M.params_of(engine), M.params_of(untouched)
    state["same_training"] = all(torch.equal(a[k], b[k]) for k in a)
    return state


def test_a_refused_attach_leaves_the_engine_as_it_was() -> None:
    for res in run_ranks(_refused_attach_job, 2, timeout=200):
        kind, message = res["outcome"]
        assert kind == "GravacConfigError" and "every tensor must be compressed" in message, res["outcome"]
        assert res["zero_hooks"][0] > 0 and res["zero_hooks"][0] == res["zero_hooks"][1]
        assert res["allreduce"] is True and res["hooked"] == [] and res["handle"] is False
        assert res["momentum"] == [0.9] * len(res["momentum"])
        assert res["same_training"]
