"""ZeRO stages 1 and 2: ds_gravac carries out the gradient exchange, the ZeRO optimizer keeps the rest.

* ``mode: "dense"`` ends with DeepSpeed's own ZeRO parameters: bitwise where the reduction order is the same
  (stage 1; stage 2 with one micro-batch per step), otherwise within the tolerance of the reordering (below).
* Compressed: the gradient handed to the ZeRO optimizer is the one ds_gravac writes under ZeRO-0, and SGD on a
  flat partition is elementwise the same arithmetic as on the whole tensor, so ZeRO-1/2 with ds_gravac must end
  bitwise equal to ZeRO-0 with ds_gravac (same bytes per step too) — for Top-k, DGC, GraVAC, PowerSGD and 1-bit.
* Checkpoints (ZeRO's partitioned files plus ds_gravac's per-rank state) resume to the uninterrupted run.
* fp16 (possible with ZeRO-1/2 only): an overflow step is skipped on every rank with every ds_gravac state
  unchanged, and residuals live in unscaled space: a run whose dynamic loss scale halves mid-run ends bitwise
  equal to a run at a static scale (power-of-two scales are exact in fp16 arithmetic).

Reduction-order tolerance: ZeRO-2 reduces every micro-batch and accumulates the averages (``Σ_m Σ_w g/N``),
ds_gravac accumulates first and averages once per step (``Σ_w Σ_m g / N``; the same data, fewer messages). Each
averaged gradient element then differs by a few roundings of the gradient dtype, and three ranks' sums are
ordered differently by gloo's reduce and all-reduce. Such differences move a weight by far less than one unit in
the last place (ulp) of the dtype per step, but a master weight that crosses a rounding boundary changes its
low-precision copy by one ulp, which the next steps then see. So the bound is stated in ulps of each parameter:
fp32 ≤ 8 ulps, bf16 ≤ 2 ulps (bf16 parameters are rounded copies of fp32 masters). The test also checks that
training moved the weights by many times that bound.

bf16 optimizers: under ZeRO-0, DeepSpeed steps bf16 models with its FP16_UnfusedOptimizer, under ZeRO-1/2 with
the ZeRO optimizer — two different optimizers (DeepSpeed's own ZeRO-0 and ZeRO-1 bf16 runs of this model differ by
up to 0.006 after 4 steps, measured). So bf16 with compression is compared with ZeRO-0 within the 2-ulp bound,
fp32 bitwise.

The CPU accelerator reports fp16 unsupported (its probe asks oneDNN for fp16 kernels, which these CPUs lack),
so DeepSpeed refuses fp16 engines here; torch's own CPU fp16 kernels run the small model fine, so the fp16 jobs
override that probe on the accelerator class before building the engines (nothing of torch.distributed is
touched).
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import models as M
from harness import run_ranks

DENSE = {"mode": "dense", "bucket_cap_mb": 0.02}
COMPRESSED = {
    "topk": {"mode": "static", "compressor": "topk", "cf": 20},
    "dgc": {"mode": "static", "compressor": "dgc", "cf": 20, "min_compress_numel": 0},
    # omega 0: no settling on measured step times (the resume test compares two runs timed separately)
    "gravac": {"mode": "gravac", "compressor": "topk", "theta_min": 4, "theta_max": 64, "refresh_steps": 2,
               "window": 4, "omega": 0.0},
    "powersgd": {"mode": "static", "compressor": {"type": "powersgd", "params": {"rank": 2}}},
    "onebit": {"mode": "static", "compressor": "onebit"},
    "default": {},      # the product's defaults: static QSGD over the parameter-server exchange
    # auto on a nominal slow link (deterministic plans), a decision every 2 steps; on 128-wide layers (at 64,
    # its reference rank 16 does not compress a matrix, so its budget keeps every layer dense)
    "auto": {"mode": "auto", "compressor": "powersgd",
             "auto": {"warmup_steps": 0, "interval_steps": 2,
                      "sample_steps": 1, "tight_steps": 0, "dwell": 1, "pin_below_numel": 0,
                      "link": "nominal", "link_gbit_s": 0.01, "detector_eta": None}},
}
WIDTH = {"auto": 128}
ULPS = {torch.float32: 8, torch.bfloat16: 2}
ENGINE_COUNTERS = {"/replicated/step", "/local/global_steps"}     # copies of engine.global_steps, which counts
#                                                                    skipped steps too
STEPS, GAS = 4, 2
RESUME_CASES = (("topk", 2), ("gravac", 1), ("dgc", 2), ("powersgd", 2), ("onebit", 1))


def _zero_cfg(gravac: Any, stage: int, world: int, bf16: bool = False, gas: int = GAS, **zero: Any) -> dict:
    return M.ds_config(gravac, gas=gas, bf16=bf16, world=world, zero_allow_untested_optimizer=True,
                       zero_optimization={"stage": stage, **zero})


def _run(gravac: Any, stage: int, rank: int, world: int, bf16: bool = False, gas: int = GAS,
         width: int = 64, **zero: Any) -> dict:
    import deepspeed

    import ds_gravac
    model = M.make_model(seed=0, width=width)
    init = deepspeed.initialize if gravac is None else ds_gravac.initialize
    engine, *_ = init(model=model, model_parameters=model.parameters(),
                      config=_zero_cfg(gravac, stage, world, bf16, gas, **zero))
    M.train(engine, rank, STEPS, gas=gas, dtype=torch.bfloat16 if bf16 else None)
    handle = ds_gravac.get_handle(engine)
    return {"params": M.params_of(engine), "flag": engine.enable_backward_allreduce,
            "bytes": [r["bytes_sent"] for r in handle.pop_stats()] if handle else None,
            "hooks": len(getattr(engine.optimizer, "_grad_acc_hooks", ()))}


def _dense_parity_job(rank: int, world: int) -> dict:
    out = {}
    cases = [(1, False, GAS, {}), (2, False, GAS, {}), (1, True, GAS, {}), (2, True, GAS, {}),
             (2, False, 1, {}), (2, True, 1, {})]
    if world == 2:      # DeepSpeed's reduction variants: its all-reduce path, overlap, small buckets
        cases += [(1, False, GAS, {"reduce_scatter": False, "overlap_comm": True}),
                  (2, False, 1, {"overlap_comm": True, "contiguous_gradients": False, "reduce_bucket_size": 3000})]
    for stage, bf16, gas, zero in cases:
        key = (stage, bf16, gas, tuple(sorted(zero)))
        out[key] = {"deepspeed": _run(None, stage, rank, world, bf16, gas, **zero),
                    "gravac": _run(DENSE, stage, rank, world, bf16, gas, **zero)}
    return out


def _ulps(ref: torch.Tensor, got: torch.Tensor, dtype: torch.dtype) -> float:
    """Largest difference in units of the last place of ``dtype`` at the tensor's largest magnitude: the
    reordering perturbs each weight by ``lr·δg``, an absolute amount, so it is measured against the coarsest
    rounding step the tensor has, not against each (possibly tiny) weight's own."""
    top = float(ref.abs().max().clamp_min(torch.finfo(dtype).tiny))
    ulp = 2.0 ** math.floor(math.log2(top)) * torch.finfo(dtype).eps
    return float((ref - got).abs().max()) / ulp


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def dense_runs(request: pytest.FixtureRequest) -> tuple[int, list]:
    return request.param, run_ranks(_dense_parity_job, request.param)


def test_dense_matches_deepspeed_zero(dense_runs: tuple) -> None:
    world, results = dense_runs
    init = M.params_of_model(M.make_model(seed=0))
    for key in results[0]:
        stage, bf16, gas, _ = key
        dtype = torch.bfloat16 if bf16 else torch.float32
        bitwise = world == 2 and (stage == 1 or gas == 1)
        for res in results:
            ds, gv = res[key]["deepspeed"], res[key]["gravac"]
            assert gv["flag"] is False and gv["hooks"] == 0 and ds["hooks"] >= 0
            for name, ref in ds["params"].items():
                if bitwise:
                    assert torch.equal(ref, gv["params"][name]), (key, name)
                else:
                    assert _ulps(ref, gv["params"][name], dtype) <= ULPS[dtype], (key, name)
            moved = max(_ulps(init[n], ds["params"][n], dtype) for n in init if n.endswith("weight"))
            assert moved > 25 * ULPS[dtype], "training must move the weights far beyond the tolerance"
        for name in results[0][key]["gravac"]["params"]:
            assert all(torch.equal(results[0][key]["gravac"]["params"][name], r[key]["gravac"]["params"][name])
                       for r in results[1:]), "replicas differ"


def _compressed_job(rank: int, world: int) -> dict:
    out = {}
    for name, section in COMPRESSED.items():
        base = {"bucket_cap_mb": 0.02, "min_compress_numel": 1000, **section}
        out[name] = {stage: _run(base, stage, rank, world, width=WIDTH.get(name, 64)) for stage in (0, 1, 2)}
    topk = {"bucket_cap_mb": 0.02, "min_compress_numel": 1000, **COMPRESSED["topk"]}
    out["topk_bf16"] = {stage: _run(topk, stage, rank, world, bf16=True) for stage in (0, 1, 2)}
    return out


@pytest.fixture(scope="module")
def compressed_runs() -> list:
    return run_ranks(_compressed_job, 2)


@pytest.mark.parametrize("name", [*COMPRESSED, "topk_bf16"])
def test_compressed_under_zero_equals_zero0(compressed_runs: list, name: str) -> None:
    init = M.params_of_model(M.make_model(seed=0, width=WIDTH.get(name, 64)))
    for res in compressed_runs:
        runs = res[name]
        dense_bytes_each = runs[0]["bytes"]
        assert all(b > 0 for b in dense_bytes_each)
        if name == "auto":      # it did compress: a decided step sends less than its first (dense) step
            assert min(dense_bytes_each) < dense_bytes_each[0], dense_bytes_each
        for stage in (1, 2):
            assert runs[stage]["bytes"] == dense_bytes_each, f"stage {stage}: bytes per step differ from ZeRO-0"
            for key, ref in runs[0]["params"].items():
                if name.endswith("bf16"):     # see the module docstring (bf16 optimizers)
                    assert _ulps(ref, runs[stage]["params"][key], torch.bfloat16) <= ULPS[torch.bfloat16], key
                else:
                    assert torch.equal(ref, runs[stage]["params"][key]), f"stage {stage}: {key}"
        assert not torch.equal(init["out.weight"], runs[2]["params"]["out.weight"])
    for stage in (1, 2):
        for key in compressed_runs[0][name][stage]["params"]:
            assert torch.equal(compressed_runs[0][name][stage]["params"][key],
                               compressed_runs[1][name][stage]["params"][key]), "replicas differ"


def _resume_job(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    out = {}
    for name, stage in RESUME_CASES:
        base = {"bucket_cap_mb": 0.02, "min_compress_numel": 1000, **COMPRESSED[name]}
        tag = f"{name}_zero{stage}"

        def engine() -> Any:
            model = M.make_model(seed=0)
            return ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                        config=_zero_cfg(base, stage, world, gas=1))[0]
        straight = engine()
        M.train(straight, rank, 6)
        first = engine()
        M.train(first, rank, 3)
        slots = ds_gravac.get_handle(first).state_dict()["local"]["memory"]["slots"]
        ds_gravac.get_handle(first).save_checkpoint(save_dir, tag=tag)
        resumed = engine()
        path, _ = ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag=tag)
        M.train(resumed, rank, 3, start=3)
        memory = sum(float(t.double().norm()) for slot in slots.values() for t in slot.values())
        out[tag] = {"straight": M.params_of(straight), "resumed": M.params_of(resumed),
                    "loaded": path is not None, "memory_norm": memory}
        ds_gravac.get_handle(resumed).detach()     # the ZeRO optimizer reduces again, with its own hooks
        M.train(resumed, rank, 1, start=6)
        out[tag].update(after_detach=M.params_of(resumed), flag=resumed.enable_backward_allreduce,
                        hooks=len(resumed.optimizer._grad_acc_hooks))
    return out


def test_zero_checkpoint_resume_equals_uninterrupted(tmp_path: Any) -> None:
    import os
    results = run_ranks(_resume_job, 2, str(tmp_path))
    for res in results:
        for tag, r in res.items():
            assert r["loaded"] and r["memory_norm"] > 0, f"{tag}: the test must save non-zero memory"
            for key, value in r["straight"].items():
                assert torch.equal(value, r["resumed"][key]), (tag, key)
            assert r["flag"] is True and r["hooks"] > 0, "detach gives ZeRO its reduction (and its hooks) back"
            assert not torch.equal(r["after_detach"]["out.weight"], r["resumed"]["out.weight"])
    for tag in results[0]:
        for key, value in results[0][tag]["after_detach"].items():
            assert torch.equal(value, results[1][tag]["after_detach"][key]), f"{tag}: replicas differ after detach"
        files = os.listdir(tmp_path / tag)
        assert any("optim_states" in f for f in files), files        # ZeRO's own partitioned state
        assert {f"gravac_rank{r:05d}.pt" for r in range(2)} <= set(files)


def _fp16_job(rank: int, world: int, stage: int) -> dict:
    from deepspeed.accelerator import get_accelerator
    type(get_accelerator()).is_fp16_supported = lambda self: True     # see the module docstring
    import ds_gravac
    section = {"bucket_cap_mb": 0.02, "min_compress_numel": 1000, **COMPRESSED["topk"]}
    out = {}
    for scaling in ("dynamic", "static"):
        fp16 = ({"enabled": True, "initial_scale_power": 8, "hysteresis": 1} if scaling == "dynamic"
            else {"enabled": True, "loss_scale": 256})
        model = M.make_model(seed=0).half()
        cfg = M.ds_config(section, world=world, zero_allow_untested_optimizer=True,
                          zero_optimization={"stage": stage}, fp16=fp16)
        engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        handle = ds_gravac.get_handle(engine)
        scales, states = [], []
        for s in range(6):
            x, y = M.batch(rank, s)
            loss = torch.nn.functional.cross_entropy(engine(x.half()).float(), y)
            if s == 2 and rank == world - 1:
                loss = loss * math.inf           # one rank overflows: every rank must skip
            states.append(handle.state_dict())
            engine.backward(loss)
            engine.step()
            scales.append(float(engine.optimizer.loss_scale))
        out[scaling] = {"scales": scales, "skipped": engine.skipped_steps, "params": M.params_of(engine),
                        "state_before": states[2], "state_after": states[3]}
    return out


def _state_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two nested state dicts differ (tensors compared bitwise)."""
    if isinstance(a, torch.Tensor):
        return [] if isinstance(b, torch.Tensor) and torch.equal(a, b) else [path]
    if isinstance(a, dict):
        if not isinstance(b, dict) or a.keys() != b.keys():
            return [path]
        return [d for k in a for d in _state_diff(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _state_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


@pytest.mark.parametrize("stage", [1, 2])
def test_fp16_overflow_skipped_and_residuals_unscaled(stage: int) -> None:
    results = run_ranks(_fp16_job, 2, stage)
    for res in results:
        dyn, static = res["dynamic"], res["static"]
        assert dyn["skipped"] == 1 and static["skipped"] == 1
        assert dyn["scales"][:2] == [256.0, 256.0] and dyn["scales"][2] == 128.0     # the scale did change
        assert all(s == 256.0 for s in static["scales"])
        changed = set(_state_diff(dyn["state_before"], dyn["state_after"]))
        assert changed <= ENGINE_COUNTERS, f"a skipped step changed ds_gravac state: {sorted(changed)}"
        for key, value in static["params"].items():
            assert torch.equal(value, dyn["params"][key]), key
    for key in results[0]["dynamic"]["params"]:
        assert torch.equal(results[0]["dynamic"]["params"][key], results[1]["dynamic"]["params"][key])
