"""Everything that selects a collective is agreed at attach: a model, config or file problem on one rank is a clear
ds_gravac error on every rank — never a hang, never a raw gloo error from inside DeepSpeed's parameter broadcast.
Accordion decides from an agreed learning rate and has a state checksum like GraVAC."""
from __future__ import annotations

import os

import pytest
import torch

import models as M
from harness import run_ranks

STATIC = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": 1000, "bucket_cap_mb": 0.02}


def _initialize(gravac: dict, model: torch.nn.Module, **kw) -> object:
    import ds_gravac
    return ds_gravac.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                config=M.ds_config(gravac, **kw))[0]


def _outcome(fn) -> tuple[str, str]:
    try:
        fn()
        return ("ok", "")
    except Exception as exc:   # noqa: BLE001 - the test records which error every rank saw
        return (type(exc).__name__, str(exc))


def _models_job(rank: int, world: int) -> dict:
    out = {}

    def extra() -> None:
        model = M.make_model()
        if rank == 1:
            model.extra = torch.nn.Linear(4, 4)
        _initialize(STATIC, model)
    out["extra"] = _outcome(extra)

    def frozen() -> None:
        model = M.make_model()
        if rank == 1:
            model.hidden[2].weight.requires_grad_(False)
        _initialize(STATIC, model)
    out["frozen"] = _outcome(frozen)

    def reshaped() -> None:   # same names, one shape differs: DeepSpeed's broadcast would fail in gloo
        model = M.make_model(width=64 if rank == 0 else 48)
        _initialize(STATIC, model)
    out["reshaped"] = _outcome(reshaped)

    def config_key() -> None:
        _initialize({**STATIC, "cf": 10 if rank == 0 else 20, "seed": 3 if rank == 0 else 4}, M.make_model())
    out["config_key"] = _outcome(config_key)
    return out


@pytest.fixture(scope="module")
def models_results() -> list:
    return run_ranks(_models_job, 2, timeout=200)


@pytest.mark.parametrize("case, words", [("extra", "rank 1 has 'extra.weight', rank 0 does not"),
                                         ("frozen", "'hidden.2.weight' on rank 0 vs rank 1: requires_grad True "
                                                    "vs False"),
                                         ("reshaped", "'hidden.0.weight' on rank 0 vs rank 1: shape (64, 64) vs "
                                                      "(48, 48)")])
def test_parameter_mismatch_is_a_clear_error_on_every_rank(models_results: list, case: str, words: str) -> None:
    for res in models_results:
        kind, message = res[case]
        assert kind == "GravacError", (kind, message)
        assert message.startswith("ds_gravac: the model's parameters differ across ranks") and words in message


def test_config_difference_names_the_keys(models_results: list) -> None:
    for res in models_results:
        kind, message = res["config_key"]
        assert kind == "GravacConfigError"
        assert "differs across ranks in: cf, seed" in message


def _telemetry_job(rank: int, world: int, tmp: str) -> dict:
    blocker = os.path.join(tmp, "a_file")
    if rank == 0:
        open(blocker, "w").close()
    out = {}
    # rank 0 writes (no {rank}); its directory cannot be created because a file is in the way
    out["rank0_only"] = _outcome(lambda: _initialize({**STATIC, "telemetry": {"jsonl": f"{blocker}/x/steps.jsonl"}},
                                                     M.make_model()))
    # every rank writes its own file (same config); only rank 1's directory is impossible (a file named d1)
    if rank == 1:
        open(os.path.join(tmp, "d1"), "w").close()
    path = os.path.join(tmp, "d{rank}", "steps.jsonl")
    out["rank1_only"] = _outcome(lambda: _initialize({**STATIC, "telemetry": {"jsonl": path}}, M.make_model()))
    return out


def test_unwritable_telemetry_file_fails_on_every_rank(tmp_path) -> None:
    for res in run_ranks(_telemetry_job, 2, str(tmp_path), timeout=200):
        for case, rank in (("rank0_only", 0), ("rank1_only", 1)):
            kind, message = res[case]
            assert kind == "GravacConfigError", (case, kind, message)
            assert f"rank {rank}: ds_gravac: telemetry.jsonl: cannot create" in message


ACCORDION = {"mode": "accordion", "compressor": "topk", "min_compress_numel": 1000, "bucket_cap_mb": 0.02,
             "accordion": {"interval_steps": 4, "high_compression": 20}}


def _accordion_job(rank: int, world: int, diverge: bool) -> dict:
    """Rank 1's optimizer sees a learning-rate decay that rank 0 does not (a rank-local value): decisions must
    follow the agreed (rank 0) learning rate, so both ranks keep sending the same levels."""
    import ds_gravac
    engine = _initialize({**ACCORDION, "agreement_check_interval": 1}, M.make_model())
    handle = ds_gravac.get_handle(engine)
    levels, error = [], ""
    try:
        for s in range(12):
            if rank == 1 and s == 6:
                for group in engine.optimizer.param_groups:
                    group["lr"] = group["lr"] * 0.1
            if diverge and rank == 1 and s == 9:
                handle.controller.codes = [1 - c for c in handle.controller.codes]
            M.train(engine, rank, 1, start=s)
            rec = handle.last_stats()
            levels.append((rec["step"], rec["accordion/low_fraction"], rec["accordion/lr_override"]))
    except ds_gravac.GravacError as exc:
        error = str(exc)
    return {"levels": levels, "error": error}


def _accordion_jobs(rank: int, world: int) -> dict:
    """The agreed run, then the one whose rank 1 diverges (it ends in the checksum error), on one spawn."""
    return {diverge: _accordion_job(rank, world, diverge) for diverge in (False, True)}


@pytest.fixture(scope="module")
def accordion_runs() -> list:
    return run_ranks(_accordion_jobs, 2, timeout=200)


def test_accordion_uses_the_agreed_learning_rate(accordion_runs: list) -> None:
    r0, r1 = (r[False] for r in accordion_runs)
    assert not r0["error"] and not r1["error"], (r0["error"], r1["error"])
    assert r0["levels"] == r1["levels"] and len(r0["levels"]) == 12


def test_accordion_state_checksum_catches_diverged_codes(accordion_runs: list) -> None:
    for res in (r[True] for r in accordion_runs):
        assert "ranks hold different controller states at step 9" in res["error"], res
