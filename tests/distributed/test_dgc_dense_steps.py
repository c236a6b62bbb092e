"""DGC's memory on dense steps (GraVAC's dense fallback), checked against DeepSpeed's own dense path.

Every step is forced dense through the controller's own ``force_dense`` branch. With the rule (a dense
step clears u and v) DGC's sent value is ``g + wd·w`` every step, i.e. SGD *without* momentum; with
``dense_keeps_momentum``, with or without masking, u survives and the run is momentum SGD (GraVAC's dense fallback
over DGC with its default masking must not lose the momentum). Both are compared with plain
DeepSpeed engines (no ds_gravac) running SGD with momentum 0 and 0.9.
"""
from __future__ import annotations

from typing import Optional

import pytest

import models as M
from harness import run_ranks

STEPS = 6


def _job(rank: int, world: int, dgc_params: Optional[dict], momentum: float) -> dict:
    import deepspeed
    import ds_gravac
    model = M.make_model()
    if dgc_params is None:
        cfg = M.ds_config()
        cfg["optimizer"]["params"]["momentum"] = momentum
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    else:
        gravac = {"mode": "static", "compressor": {"type": "dgc", "params": dgc_params}, "cf": 10,
                  "min_compress_numel": 0}
        engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                          config=M.ds_config(gravac))
        M.force_dense(ds_gravac.get_handle(engine), lambda step: True)
    M.train(engine, rank, STEPS)
    return M.params_of(engine)


def _rel_err(a: dict, b: dict, start: dict) -> float:
    num = sum(float((a[n] - b[n]).double().norm() ** 2) for n in a) ** 0.5
    den = sum(float((b[n] - start[n]).double().norm() ** 2) for n in b) ** 0.5
    return num / den


CASES = {"spec_reset": (False, True, 0.0), "spec_reset_nomask": (False, False, 0.0),
         "keep_momentum": (True, False, 0.9), "keep_with_masking": (True, True, 0.9)}


def _all_jobs(rank: int, world: int) -> dict:
    """Every DGC variant and both DeepSpeed references (momentum 0 and 0.9) in one spawn of the ranks."""
    out = {m: _job(rank, world, None, m) for m in (0.0, 0.9)}
    for case, (keep, masking, _) in CASES.items():
        out[case] = _job(rank, world, {"momentum": 0.9, "momentum_masking": masking, "dense_keeps_momentum": keep},
                         0.9)
    return out


@pytest.fixture(scope="module")
def runs() -> list:
    return run_ranks(_all_jobs, 2)


@pytest.mark.parametrize("case", list(CASES))
def test_dgc_dense_steps_match_deepspeed_sgd(runs: list, case: str) -> None:
    _, _, momentum = CASES[case]
    got = [r[case] for r in runs]
    want = runs[0][momentum]
    other = runs[0][0.9 if momentum == 0.0 else 0.0]
    start = M.params_of_model(M.make_model())
    for res in got:
        assert _rel_err(res, want, start) < 1e-5
        assert _rel_err(res, other, start) > 1e-2     # the two references really differ over these steps


def _optimizer_job(rank: int, world: int, local_wd: bool) -> dict:
    import ds_gravac
    model = M.make_model()
    gravac = {"mode": "static", "cf": 10, "min_compress_numel": 0,
              "compressor": {"type": "dgc", "params": {"momentum": 0.9, "local_weight_decay": local_wd}}}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(gravac))
    group = engine.optimizer.param_groups[0]
    attached = (group["momentum"], group["weight_decay"])
    ds_gravac.detach(engine)
    return {"attached": attached, "detached": (group["momentum"], group["weight_decay"])}


def _optimizer_jobs(rank: int, world: int) -> dict:
    return {local_wd: _optimizer_job(rank, world, local_wd) for local_wd in (True, False)}


@pytest.fixture(scope="module")
def optimizer_runs() -> list:
    return run_ranks(_optimizer_jobs, 2)


@pytest.mark.parametrize("local_wd", [True, False])
def test_weight_decay_stays_with_the_optimizer_unless_dgc_applies_it(optimizer_runs: list, local_wd: bool) -> None:
    """DGC always takes the momentum; the weight decay only with ``local_weight_decay`` (otherwise the optimizer
    keeps applying it — it used to be zeroed either way, so the run had no weight decay at all)."""
    for res in (r[local_wd] for r in optimizer_runs):
        assert res["attached"] == (0.0, 0.0 if local_wd else 1e-4)
        assert res["detached"] == (0.9, 1e-4)
