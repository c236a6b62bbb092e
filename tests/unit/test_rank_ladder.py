"""The uniform rank ladder of GraVAC over a low-rank compressor (``"rank_ladder": "uniform"``): its validation,
its level-to-rank rule, the pinned classifier, and that the default keeps the per-matrix CF mapping."""
from __future__ import annotations

import pytest
import torch

from ds_gravac.adapt.levels import classifier_shapes
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError
from ds_gravac.integration.engine import build_compressor

UNIFORM = {"mode": "gravac", "compressor": "powersgd", "rank_ladder": "uniform"}


def _paying(n: int, m: int) -> int:
    return max([0] + [k for k in range(1, min(n, m) + 1) if (n + m) * k * 2 < n * m])


def test_unknown_value_names_the_key_and_the_allowed_values() -> None:
    with pytest.raises(GravacConfigError) as info:
        parse_config({**UNIFORM, "rank_ladder": "flat"})
    assert "rank_ladder" in str(info.value) and "'cf'" in str(info.value) and "'uniform'" in str(info.value)


@pytest.mark.parametrize("section, why", [({**UNIFORM, "mode": "static"}, "mode is 'static'"),
                                          ({**UNIFORM, "compressor": "topk"}, "'topk' is not low-rank")])
def test_uniform_needs_gravac_over_a_lowrank_compressor(section: dict, why: str) -> None:
    with pytest.raises(GravacConfigError) as info:
        build_compressor(parse_config(section))
    assert "rank_ladder" in str(info.value) and why in str(info.value)


@pytest.mark.parametrize("comp", ["powersgd", "acpsgd"])
def test_every_matrix_gets_the_rung_capped_at_what_pays(comp: str) -> None:
    c = build_compressor(parse_config({**UNIFORM, "compressor": comp}))
    assert c.cf_grid() == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0] and c.bound == 2.0   # unset theta_min: rank 64
    c.pin([(100, 2048)])
    for rung in (64, 32, 16, 8, 4, 2, 1):
        for n, m in ((64, 576), (256, 2304), (64, 64), (512, 4608)):
            assert c.rank_for(n, m, 128 / rung) == min(rung, _paying(n, m)), (n, m, rung)
        assert c.rank_for(100, 2048, 128 / rung) == min(max(rung, 16), 47)   # pinned at rank >= 16, pays < 48
    c.pin([(10, 2048)])                                                 # rank 16 does not pay: always plain
    assert all(not c.tensor_plan((10, 2048), lvl).get("rank") for lvl in c.cf_grid())


def test_theta_min_snaps_up_to_a_rung() -> None:
    c = build_compressor(parse_config({**UNIFORM, "theta_min": 5}))
    assert c.bound == 8.0 and c.width(256, 2304) == 16


def test_default_keeps_one_cf_mapped_to_a_rank_per_matrix() -> None:
    c = build_compressor(parse_config({"mode": "gravac", "compressor": "powersgd", "theta_min": 10}))
    assert c.cf_grid() is None and c.rank_for(64, 576, 10) == 5 and c.rank_for(10, 2048, 10) == 1


def test_the_classifier_is_the_last_compressed_matrix() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 10),
                              torch.nn.Linear(4, 4))
    c = build_compressor(parse_config(UNIFORM))
    assert classifier_shapes(list(net.named_parameters()), c.accepts, 100) == [(10, 64)]
    assert classifier_shapes(list(net.named_parameters()), c.accepts, 10**6) == []
