"""Config schema (docs/configuration.md) and the bucket plan (docs/design.md), single process."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError
from ds_gravac.sync.buckets import BucketPlan, classify


def test_defaults_are_the_documented_ones() -> None:
    """docs/configuration.md: an empty section is ``auto`` over PowerSGD on tensors of at least 16,384 values
    (since 0.5); ``"mode": "static"`` alone is static QSGD with 8-bit codes on every tensor (0.4's defaults); the
    low-rank compressors default to rank 16; the GraVAC keys keep the paper's values for "mode": "gravac"."""
    from ds_gravac.compress.registry import lookup

    auto = parse_config({})
    assert (auto.mode, auto.compressor.type, auto.compressor.params, auto.min_compress_numel) == (
        "auto", "powersgd", {}, 16384)
    assert parse_config({"compressor": "topk"}).mode == "auto"
    assert parse_config({"mode": "auto", "min_compress_numel": 0}).min_compress_numel == 0
    cfg = parse_config({"mode": "static"})
    assert (cfg.mode, cfg.compressor.type, cfg.compressor.params) == ("static", "qsgd", {})
    qsgd = lookup("qsgd")()
    assert (qsgd.params.levels, qsgd.params.bucket_size, qsgd.default_cf()) == (127, 128, 4.0)   # 8-bit codes
    assert cfg.quantized_exchange == "auto"             # its own exchange: the parameter server (CaSync-PS)
    assert lookup("powersgd").Params().rank == 16 and lookup("acpsgd").Params().rank == 16
    assert (cfg.static_cf(), cfg.gravac.theta_min, cfg.gravac.theta_max) == (100, 10, 1000)
    g = cfg.gravac
    assert (g.epsilon, g.omega, g.window, g.refresh_steps, g.min_sent_steps) == (0.7, 0.01, 500, 20, 10)
    assert (cfg.bucket_cap_mb, cfg.min_compress_numel, cfg.overlap, cfg.bulk) == (25, 0, True, True)


def test_parameters_without_a_type_name_the_default_they_were_checked_against() -> None:
    """A version-0.3 section that relied on the PowerSGD default (``{"compressor": {"params": {"rank": 8}}}``) now
    meets QSGD's parameters; the error says the type was defaulted and which key to set."""
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError) as info:
        build_compressor(parse_config({"mode": "static", "compressor": {"params": {"rank": 8}}}))
    assert "invalid parameters for compressor 'qsgd' (key \"compressor.type\" is not set" in str(info.value)
    assert '"powersgd" for "rank"' in str(info.value) and "\nrank\n" in str(info.value)   # pydantic names the key
    with pytest.raises(GravacConfigError) as info:
        build_compressor(parse_config({"mode": "static", "compressor": {"type": "qsgd", "params": {"rank": 8}}}))
    assert "is not set" not in str(info.value)
    build_compressor(parse_config({"mode": "static", "compressor": {"type": "powersgd", "params": {"rank": 8}}}))


def test_bare_compressor_name_and_auto_values() -> None:
    cfg = parse_config({"compressor": "dgc", "cf": "auto", "accordion": {"eta": "auto"}})
    assert cfg.compressor.type == "dgc" and cfg.compressor.params == {}
    assert cfg.static_cf() == 100 and cfg.accordion.eta == 0.5


def test_caller_dict_is_not_mutated() -> None:
    section = {"cf": "auto", "compressor": "topk"}
    parse_config(section)
    assert section == {"cf": "auto", "compressor": "topk"}


@pytest.mark.parametrize("section, fragment", [
    ({"omega": 1.0}, "omega\n  Input should be less than 1"),
    ({"seed": -1}, "seed\n  Input should be greater than or equal to 0"),
    ({"scaling_policy": "linear"}, "Input should be 'exponential' or 'geometric'"),
    ({"ewma_alpha_range": [0.5, 0.1]}, "must satisfy 0 < lo <= hi <= 1"),
    ({"accordion": {"interval_steps": 5, "accum_steps": 6}}, "accum_steps (6) must be <="),
    ({"cost_model": {"probe_bytes": [2048]}}, "needs >= 2 distinct sizes"),
    ({"telemetry": {"jsonl": 3}}, "telemetry.jsonl"),
    ({"step_size": 1}, "step_size\n  Input should be greater than 1"),
])
def test_bad_values_name_key_value_and_range(section: dict, fragment: str) -> None:
    with pytest.raises(GravacConfigError) as err:
        parse_config(section)
    assert str(err.value).startswith('ds_gravac: invalid "gravac" config:')
    assert fragment in str(err.value)


def test_config_hash_is_stable_and_sensitive() -> None:
    assert parse_config({"cf": 10}).config_hash() == parse_config({"cf": 10.0}).config_hash()
    assert parse_config({"cf": 10}).config_hash() != parse_config({"cf": 11}).config_hash()


def _members(sizes: list[int], min_numel: int = 0, dtypes: list[torch.dtype] | None = None) -> list:
    params = [(f"p{i}", nn.Parameter(torch.zeros(n, dtype=(dtypes or [torch.float32] * len(sizes))[i])))
              for i, n in enumerate(sizes)]
    return classify(params, lambda shape: True, min_numel, compress_enabled=True)


def test_capacity_streams_and_oversize() -> None:
    members = _members([100, 100, 5, 300, 100, 7], min_numel=50)
    plan = BucketPlan(members, list(range(6)), cap_elems=250, frozen=True, compressor_type="topk")
    layout = [(b.compressible, [m.name for m in b.members]) for b in plan.buckets]
    # plan order = completion order (last member's position): the open small-tensor bucket goes last
    assert layout == [(True, ["p0", "p1"]), (True, ["p3"]), (True, ["p4"]), (False, ["p2", "p5"])]
    assert [b.index for b in plan.buckets] == [0, 1, 2, 3]
    assert all(m.offset + m.numel <= plan.buckets[m.bucket].numel for m in members)


def test_dtype_split_and_signature() -> None:
    members = _members([10, 10, 10], dtypes=[torch.float32, torch.bfloat16, torch.float32])
    plan = BucketPlan(members, [0, 1, 2], cap_elems=1000, frozen=True, compressor_type="topk")
    assert sorted(len(b.members) for b in plan.buckets) == [1, 2]
    again = BucketPlan(_members([10, 10, 10], dtypes=[torch.float32, torch.bfloat16, torch.float32]),
                       [0, 1, 2], cap_elems=1000, frozen=True, compressor_type="topk")
    assert plan.layout_signature() == again.layout_signature()
    other = BucketPlan(members, [2, 1, 0], cap_elems=1000, frozen=True, compressor_type="topk")
    assert other.layout_signature() != plan.layout_signature()


def test_order_completion_appends_never_ready_in_reverse() -> None:
    assert BucketPlan.complete_order([3, 1], 5) == [3, 1, 4, 2, 0]
    assert BucketPlan.provisional_order(3) == [2, 1, 0]
