"""Every rejected set-up and bad config value raises a clear error at attach time, before the engine is changed.

Real 2-rank engines throughout. Two set-ups cannot be built on the supported CPUs by DeepSpeed itself (fp16:
"Type fp16 is not supported on your device"; tensor parallelism needs an mpu), so for those the real engine's
reported setting is overridden on the instance, which exercises the same check.
"""
from __future__ import annotations

import pytest

import models as M
from harness import run_ranks

ZERO_OK = {"zero_allow_untested_optimizer": True}
ENGINE_CASES = {
    "zero3": ({"zero_optimization": {"stage": 3}, **ZERO_OK}, None,
              "zero_optimization.stage 3 is not supported (allowed: 0, 1, 2)"),
    "zero_offload": ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, **ZERO_OK}, None,
                     "zero_optimization.offload_optimizer is not supported"),
    "zero_bf16_fp32_accumulation": ({"zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
                                     "data_types": {"grad_accum_dtype": "fp32"}, **ZERO_OK}, None,
                                    "data_types.grad_accum_dtype different from the model dtype"),
    "fp16": ({}, ("fp16_enabled", lambda: True), "fp16 with zero_optimization.stage 0 is not supported"),
    "autocast_fp16": ({"torch_autocast": {"enabled": True, "dtype": "torch.float16"}}, None,
                      "torch_autocast with float16"),
    "tensor_parallel": ({}, ("mp_world_size", 2), "model/sequence parallelism is not supported"),
    "deepcompile": ({"compile": {"deepcompile": True}}, None, "DeepCompile/ZenFlow are not supported"),
    "unmanaged": ({"managed_gradient_accumulation": False}, None, "managed_gradient_accumulation is false"),
}
UNIMPLEMENTED_CASES = {
    "cost_model_lowrank": ({"mode": "static", "selection": "cost_model", "compressor": "powersgd"},
                           "selection 'cost_model' is not available in this version for the compressor 'powersgd'"),
    "rank0_decisions": ({"decision_source": "rank0"}, "decision_source 'rank0'"),
}
BUILT_CASES = {"pipeline": "pipeline parallelism is not supported", "moe": "MoE layers are not supported"}
CONFIG_CASES = {
    "unknown_key": ({"windw": 5}, "Extra inputs are not permitted"),
    "bad_mode": ({"mode": "fast"}, "Input should be 'gravac', 'static', 'accordion', 'dense' or 'auto'"),
    "cf_range": ({"mode": "static", "cf": 0.5}, "cf\n  Input should be greater than or equal to 1"),
    "theta_order": ({"theta_min": 100, "theta_max": 10}, "theta_min (100) must be < theta_max (10)"),
    "window": ({"window": 30, "refresh_steps": 20}, "window (30) must be >= 2 * refresh_steps = 40"),
    "bucket_cap": ({"bucket_cap_mb": 0}, "bucket_cap_mb\n  Input should be greater than 0"),
    "accordion_interval": ({"mode": "accordion"}, "accordion.interval_steps is required"),
    "unknown_compressor": ({"mode": "static", "compressor": "zip"}, "unknown compressor 'zip'; registered:"),
    "bad_params": ({"mode": "static", "compressor": {"type": "topk", "params": {"algo": "x"}}},
                   "invalid parameters for compressor 'topk'"),
    "dgc_needs_all_compressed": ({"mode": "static", "compressor": "dgc", "min_compress_numel": 100000},
                                 "every tensor must be compressed"),
}


def _attach_errors(rank: int, world: int) -> dict:
    import deepspeed

    import ds_gravac
    out = {}
    for name, (extra, override, _) in ENGINE_CASES.items():
        model = M.make_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=M.ds_config(**extra))
        if override is not None:
            setattr(engine, override[0], override[1])
        try:
            ds_gravac.attach(engine, {"mode": "static"})
            out[name] = ("no error", None)
        except ds_gravac.GravacUnsupportedError as exc:
            out[name] = (str(exc), engine.enable_backward_allreduce)
    for name, build in (("pipeline", M.make_pipeline_module), ("moe", M.make_moe_model)):
        model = build()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config())
        before = engine.enable_backward_allreduce   # PipelineEngine keeps its own reduction: False already
        try:
            ds_gravac.attach(engine, {"mode": "static"})
            out[name] = ("no error", None)
        except ds_gravac.GravacUnsupportedError as exc:
            out[name] = (str(exc), engine.enable_backward_allreduce == before)
    for name, (section, _) in UNIMPLEMENTED_CASES.items():
        model = M.make_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config())
        try:
            ds_gravac.attach(engine, section)
            out[name] = ("no error", None)
        except ds_gravac.GravacUnsupportedError as exc:
            out[name] = (str(exc), engine.enable_backward_allreduce)
    out["agreement"] = _diverged_controller(rank)
    for name, (section, _) in CONFIG_CASES.items():
        model = M.make_model()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config())
        try:
            ds_gravac.attach(engine, section)
            out[name] = ("no error", None)
        except ds_gravac.GravacConfigError as exc:
            out[name] = (str(exc), engine.enable_backward_allreduce)
    model = M.make_model()
    try:
        ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config())
        out["no_section"] = ("no error", None)
    except ds_gravac.GravacConfigError as exc:
        out["no_section"] = (str(exc), None)
    model = M.make_model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config({"mode": "static"}))
    again = ds_gravac.attach(engine)
    out["idempotent"] = (again is ds_gravac.get_handle(engine), None)
    try:
        ds_gravac.attach(engine, {"mode": "dense"})
        out["reattach_different"] = ("no error", None)
    except ds_gravac.GravacConfigError as exc:
        out["reattach_different"] = (str(exc), None)
    return out


def _diverged_controller(rank: int) -> tuple:
    """agreement_check_interval: a controller state that differs across ranks is caught on every rank."""
    import ds_gravac
    model = M.make_model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=M.ds_config(
        {"mode": "gravac", "agreement_check_interval": 1, "min_compress_numel": 1000}))
    M.train(engine, rank, 2)
    if rank == 1:
        ds_gravac.get_handle(engine).controller.theta_min = 11.0
    try:
        M.train(engine, rank, 1, start=2)
        return ("no error", None)
    except Exception as exc:   # raised from inside backward's hook on every rank
        return (str(exc), None)


@pytest.fixture(scope="module")
def attach_results() -> dict:
    return run_ranks(_attach_errors, 2)[0]


@pytest.mark.parametrize("case", sorted(ENGINE_CASES))
def test_unsupported_engine_rejected(attach_results: dict, case: str) -> None:
    message, flag = attach_results[case]
    assert message.startswith("ds_gravac: ")
    assert ENGINE_CASES[case][2] in message
    assert flag is True, "the engine must be left untouched"


@pytest.mark.parametrize("case", sorted(BUILT_CASES))
def test_pipeline_and_moe_rejected(attach_results: dict, case: str) -> None:
    message, flag = attach_results[case]
    assert message == "ds_gravac: " + BUILT_CASES[case]
    assert flag is True


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_bad_config_rejected(attach_results: dict, case: str) -> None:
    message, flag = attach_results[case]
    assert message.startswith("ds_gravac: ")
    assert CONFIG_CASES[case][1] in message
    assert flag is True


@pytest.mark.parametrize("case", sorted(UNIMPLEMENTED_CASES))
def test_unimplemented_settings_fail_loudly(attach_results: dict, case: str) -> None:
    message, flag = attach_results[case]
    assert message.startswith("ds_gravac: " + UNIMPLEMENTED_CASES[case][1])
    assert flag is True


def test_agreement_check_catches_diverged_controller(attach_results: dict) -> None:
    assert "ranks hold different controller states at step 2" in attach_results["agreement"][0]


def test_initialize_needs_section_and_attach_is_idempotent(attach_results: dict) -> None:
    assert 'has no "gravac" section' in attach_results["no_section"][0]
    assert attach_results["idempotent"][0] is True
    assert "already attached with a different 'gravac' config" in attach_results["reattach_different"][0]
