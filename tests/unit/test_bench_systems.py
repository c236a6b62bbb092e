"""The benchmark matrix scales GraVAC's window and EWMA with the step budget and validates as real configs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ds_gravac.config import parse_config
from ds_gravac_bench.systems import system_matrix


@pytest.mark.parametrize("steps,window,alpha", [(30, 3, 0.5), (40, 4, 0.4), (300, 30, 0.065)])
def test_scaled_window_and_alpha(steps: int, window: int, alpha: float) -> None:
    gravac = system_matrix(steps, epsilon=0.5)["gv_gravac"].gravac["gravac"]
    assert gravac["window"] == window and gravac["epsilon"] == 0.5
    assert gravac["ewma_alpha"] == pytest.approx(alpha, abs=1e-3)


def test_every_gravac_section_is_a_valid_config() -> None:
    for spec in system_matrix(30).values():
        if spec.gravac is not None:
            parse_config(spec.gravac)


def test_the_default_system_runs_the_empty_section() -> None:
    """``gv_default`` measures exactly what a user gets from ``"gravac": {}``, whatever the defaults become."""
    assert system_matrix(30)["gv_default"].gravac == {}


@pytest.mark.parametrize("steps", [300, 6000])
def test_auto_systems_decide_at_the_products_own_interval_whatever_the_budget(steps: int) -> None:
    default = parse_config({"mode": "auto"}).auto.interval_steps
    for sid in ("gv_auto", "gv_auto_qsgd", "gv_auto_topk"):
        assert parse_config(system_matrix(steps)[sid].gravac).auto.interval_steps == default == 50


def test_powersgd_rows_run_both_ranks_through_the_runner_option() -> None:
    from pathlib import Path

    from ds_gravac_bench.e2e import runner_args

    matrix = system_matrix(30)
    for sid, rank in (("ddp_powersgd", "4"), ("ddp_powersgd_r1", "1")):
        args = runner_args(matrix[sid], "resnet18", 30, Path("c.json"), Path("log"), None)
        assert args[args.index("--system") + 1] == "ddp_powersgd"
        assert args[args.index("--powersgd-rank") + 1] == rank


def test_ablation_ladder_rungs_differ_only_in_overlap_and_bulk() -> None:
    from ds_gravac_bench.e2e import ablation_matrix

    ladder = ablation_matrix("topk:100")
    assert list(ladder)[:3] == ["compute_only", "ds_dense", "gv_dense"]
    assert ladder["compute_only"].system == "local" and ladder["compute_only"].gravac is None
    rungs = [s.gravac for sid, s in ladder.items() if sid.startswith("abl_")]
    assert ([(g["overlap"], g["bulk"], g.get("selection", "threshold")) for g in rungs] ==
        [(False, False, "threshold"), (True, False, "threshold"), (True, True, "threshold"),
         (True, True, "cost_model")])
    for g in rungs:
        parse_config(g)
        assert ({k: v for k, v in g.items() if k not in ("overlap", "bulk", "selection")} ==
            {"mode": "static", "compressor": "topk", "cf": 100, "min_compress_numel": 16384})
    assert ablation_matrix("dgc:10")["abl_dgc_10_plain"].gravac["min_compress_numel"] == 0


def test_cost_model_systems_differ_from_their_threshold_twins_only_in_selection() -> None:
    """gv_topk_costmodel / gv_onebit_costmodel: the cost model decides alone (no size threshold); the sections
    pass every attach-time refusal (a cost-model system the release refuses would only fail on the cluster)."""
    from ds_gravac.config import unavailable_settings
    from ds_gravac.integration.engine import build_compressor
    from ds_gravac.sync.cost_model.selector import check_priceable, exchange_candidates

    matrix = system_matrix(30)
    for sid, twin in (("gv_topk_costmodel", "gv_topk_100"), ("gv_onebit_costmodel", "gv_onebit_ps")):
        g, t = matrix[sid].gravac, matrix[twin].gravac
        assert g["selection"] == "cost_model" and g["min_compress_numel"] == 0 and matrix[sid].system == "gravac"
        differ = {k for k in set(g) | set(t) if g.get(k) != t.get(k)}
        assert differ <= {"selection", "min_compress_numel", "quantized_exchange"}, differ
        cfg = parse_config(g)
        assert unavailable_settings(cfg) == []
        comp = build_compressor(cfg)
        check_priceable(comp, exchange_candidates(cfg.quantized_exchange, comp))
    assert (exchange_candidates("auto", build_compressor(parse_config(matrix["gv_onebit_costmodel"].gravac))) ==
        ("casync_ps", "allgather"))
    chunked, whole = matrix["gv_topk_costmodel_chunks4"].gravac, matrix["gv_topk_costmodel"].gravac
    assert {k: v for k, v in chunked.items() if k != "cost_model"} == whole and "cost_model" not in whole
    assert chunked["cost_model"] == {"max_chunks": 4} and unavailable_settings(parse_config(chunked)) == []


@pytest.mark.parametrize("bad", ["topk", "powersgd:4", "topk:0.5", "topk:x"])
def test_ablation_option_rejects_bad_values(bad: str) -> None:
    from ds_gravac_bench.e2e import ablation_matrix

    with pytest.raises(SystemExit, match="--ablation"):
        ablation_matrix(bad)


@pytest.mark.parametrize("system", ["local", "local_engine"])
def test_local_system_refuses_more_than_one_rank(system: str) -> None:
    import argparse

    from runners.common import DistInfo, RunnerError
    from runners.systems import build_system

    with pytest.raises(RunnerError, match=f"--system {system} .*2 ranks"):
        build_system(argparse.Namespace(system=system), {}, torch.nn.Linear(2, 2), DistInfo(0, 2, 0))


def test_theta_min_reaches_both_gravac_systems() -> None:
    matrix = system_matrix(100, epsilon=0.3, theta_min=2)
    assert (matrix["gv_gravac"].gravac["gravac"]["theta_min"] == 2
            and matrix["gv_gravac_dgc"].gravac["gravac"]["theta_min"] == 2)
    for sid in ("gv_gravac", "gv_gravac_dgc"):
        parse_config(matrix[sid].gravac)


@pytest.mark.parametrize("flag,value,key", [("--theta-min", "0.5", "theta_min"), ("--epsilon", "-1", "epsilon"),
                                            ("--theta-min", "1000", "theta_min")])
def test_bad_gravac_options_stop_before_any_cluster(tmp_path, flag: str, value: str, key: str) -> None:
    from ds_gravac_bench.e2e import main

    out = tmp_path / "never"
    with pytest.raises(SystemExit, match=f"(?s)gv_gravac.*{key}"):
        main(["run", "--systems", "gv_gravac", flag, value, "--out", str(out)])
    assert not out.exists()


def test_system_variants_override_only_the_named_gravac_keys() -> None:
    from ds_gravac_bench.systems import resolve_system

    matrix = system_matrix(300, epsilon=0.3)
    base = matrix["gv_gravac_dgc_nomask"]
    variant = resolve_system(matrix, "gv_gravac_dgc_nomask@epsilon=0.1@theta_min=4")
    assert variant.id == "gv_gravac_dgc_nomask@epsilon=0.1@theta_min=4" and variant.system == base.system
    assert variant.gravac["gravac"]["epsilon"] == 0.1 and variant.gravac["gravac"]["theta_min"] == 4
    assert ({k: v for k, v in variant.gravac["gravac"].items() if k not in ("epsilon", "theta_min")} ==
        {k: v for k, v in base.gravac["gravac"].items() if k not in ("epsilon", "theta_min")})
    assert {k: v for k, v in variant.gravac.items() if k != "gravac"} == {k: v for k, v in base.gravac.items()
                                                                          if k != "gravac"}
    assert base.gravac["gravac"]["epsilon"] == 0.3             # the matrix entry itself is untouched
    parse_config(variant.gravac)
    assert resolve_system(matrix, "ds_dense") is matrix["ds_dense"]
    added = resolve_system(matrix, "gv_gravac@gain_denominator=raw")   # a key the matrix entry does not set
    assert "gain_denominator" not in matrix["gv_gravac"].gravac["gravac"]
    assert parse_config(added.gravac).gravac.gain_denominator == "raw"
    assert resolve_system(matrix, "gv_gravac@gravac.gain_denominator=raw").gravac == added.gravac   # its new name


def test_a_jitter_variant_is_the_same_system_with_the_runners_gradient_jitter() -> None:
    from ds_gravac_bench.e2e import runner_args
    from ds_gravac_bench.systems import jitter_control_of, resolve_system

    matrix = system_matrix(300)
    base = matrix["gv_powersgd_r16"]
    control = resolve_system(matrix, "gv_powersgd_r16@jitter=1e-6")
    assert control.id == "gv_powersgd_r16@jitter=1e-6" and control.gravac == base.gravac
    args = runner_args(control, "lstm", 10, Path("c.json"), Path("log"), None)
    assert args[-2:] == ["--grad-jitter", "1e-6"] and "--grad-jitter" not in runner_args(base, "lstm", 10,
                                                                                          Path("c.json"), Path("log"), None)
    both = resolve_system(matrix, "gv_powersgd_r16@jitter=1e-6@compressor.params.rank=8")
    assert both.gravac["compressor"]["params"]["rank"] == 8 and both.runner_args[-2:] == ("--grad-jitter", "1e-6")
    assert (jitter_control_of("gv_powersgd_r16@jitter=1e-6@compressor.params.rank=8")
            == "gv_powersgd_r16@compressor.params.rank=8")
    assert jitter_control_of("gv_powersgd_r16") is None and jitter_control_of("ds_dense_jitter") is None


@pytest.mark.parametrize("sid,match", [("gv_gravac@epsilon", "key=value"), ("gv_gravac@eps=0.1", "'eps=0.1'"),
                                       ("gv_topk_10@jitter=0", r"jitter must be a number in \(0, 0.1\]"),
                                       ("gv_topk_10@jitter=abc", "got 'abc'"),
                                       ("ddp_bf16@jitter=1e-6", "not ddp_bf16"),
                                       ("ds_dense@epsilon=0.1", "no \"gravac\" section"),
                                       ("gv_nothing@epsilon=0.1", "unknown system 'gv_nothing'"),
                                       ("gv_gravac@gain_denominator=both", "gain_denominator")])
def test_bad_system_variants_stop_before_any_cluster(tmp_path, sid: str, match: str) -> None:
    from ds_gravac_bench.e2e import main

    out = tmp_path / "never"
    with pytest.raises(SystemExit, match=match):
        main(["run", "--systems", f"compute_only,{sid}", "--out", str(out)])
    assert not out.exists()


def test_variant_values_are_validated_as_gravac_config(tmp_path) -> None:
    from ds_gravac_bench.e2e import main

    out = tmp_path / "never"
    with pytest.raises(SystemExit, match="(?s)gv_gravac@epsilon=-2.*epsilon"):
        main(["run", "--systems", "gv_gravac@epsilon=-2", "--out", str(out)])
    assert not out.exists()


def test_dotted_variant_reaches_inside_the_compressor_object() -> None:
    from ds_gravac_bench.systems import resolve_system

    matrix = system_matrix(150)
    ranked = resolve_system(matrix, "gv_powersgd_r4@compressor.params.rank=16")
    assert ranked.gravac["compressor"] == {"type": "powersgd", "params": {"rank": 16}}
    assert matrix["gv_powersgd_r4"].gravac["compressor"]["params"]["rank"] == 4      # the matrix entry is untouched
    named = resolve_system(matrix, "gv_gravac_powersgd@compressor.params.rank=8")   # compressor given by name
    assert named.gravac["compressor"] == {"type": "powersgd", "params": {"rank": 8}}
    assert parse_config(named.gravac).compressor.type == "powersgd"


def test_baselines_set_their_runner_system_or_deepspeed_key() -> None:
    """What users pick instead of compression: DeepSpeed's 16-bit all-reduce is a config key on DeepSpeed's own
    path, DDP's bf16 hook and post-local SGD are runner systems; all of them are reported as baselines."""
    from ds_gravac_bench.systems import system_config

    matrix = system_matrix(30)
    base = {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "gravac": {"mode": "dense"}}
    for dt in ("fp16", "bf16"):
        spec = matrix[f"ds_{dt}"]
        assert spec.system == "deepspeed" and spec.family == "baseline"
        assert system_config(base, spec) == {"optimizer": base["optimizer"], "communication_data_type": dt}
    assert base["gravac"] == {"mode": "dense"}                       # the base config is left untouched
    assert matrix["ddp_bf16"].system == "ddp_bf16" and matrix["ddp_localsgd"].system == "ddp_localsgd"
    assert {matrix[s].family for s in ("ddp_bf16", "ddp_localsgd", "ddp_powersgd")} == {"baseline"}
    assert matrix["ds_dense"].family is None and matrix["ddp_dense"].family is None    # dense: the reference


def test_a_runner_parameter_variant_reaches_the_runner_last() -> None:
    from pathlib import Path

    from ds_gravac_bench.e2e import runner_args
    from ds_gravac_bench.systems import resolve_system

    matrix = system_matrix(30)
    spec = resolve_system(matrix, "ddp_localsgd@period=16@start=100")
    assert spec.id == "ddp_localsgd@period=16@start=100"
    args = runner_args(spec, "resnet18", 30, Path("c.json"), Path("log"), None)
    assert args[-4:] == ["--localsgd-period", "16", "--localsgd-start", "100"]
    assert args.index("--localsgd-period") < len(args) - 4          # the default 8 comes first: argparse keeps the last
    assert resolve_system(matrix, "ddp_powersgd@rank=2").runner_args[-2:] == ("--powersgd-rank", "2")
    for bad in ("ddp_localsgd@period=x", "ddp_localsgd@every=2", "ddp_localsgd@period"):
        with pytest.raises(ValueError, match="expected @key=<integer> with key one of period, start"):
            resolve_system(matrix, bad)
    with pytest.raises(ValueError, match="has no \"gravac\" section"):
        resolve_system(matrix, "ddp_bf16@period=2")
