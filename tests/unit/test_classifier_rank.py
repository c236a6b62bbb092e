"""``compressor.params.classifier_rank``: the classifier (the last compressed matrix) at its own rank beside a
static rank — issue 42's M1 separates GraVAC's allocation (classifier at rank 1) from its controller."""
from __future__ import annotations

import pytest
import torch

from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError
from ds_gravac.integration.engine import build_compressor, ready_compressor


def _net() -> torch.nn.Module:
    # a 64×576 "convolution", a 1-D tensor, the 10×512 classifier (rank 16 would not pay on it: plain)
    return torch.nn.Sequential(torch.nn.Linear(576, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 512),
                               torch.nn.Linear(512, 10))


def _ranks(section: dict) -> dict[tuple[int, int], int]:
    cfg = parse_config(section)
    comp = build_compressor(cfg)
    named = list(_net().named_parameters())
    ready_compressor(cfg, comp, named)
    level = comp.default_level()
    return {(n, m): (comp.tensor_plan((n, m), level).get("rank") or 0)
            for n, m in ((64, 576), (512, 64), (10, 512))}


@pytest.mark.parametrize("comp", ["powersgd", "acpsgd"])
def test_the_classifier_gets_its_own_rank_and_the_rest_keeps_the_static_rank(comp: str) -> None:
    base = {"mode": "static", "min_compress_numel": 0}
    plain = _ranks({**base, "compressor": {"type": comp, "params": {"rank": 16}}})
    fixed = _ranks({**base, "compressor": {"type": comp, "params": {"rank": 16, "classifier_rank": 1}}})
    # (10 + 512)·16·2 > 10·512: rank 16 sends the classifier plain; rank 1 pays
    assert plain == {(64, 576): 16, (512, 64): 16, (10, 512): 0}
    assert fixed == {(64, 576): 16, (512, 64): 16, (10, 512): 1}


def test_a_classifier_rank_above_what_pays_sends_it_plain() -> None:
    ranks = _ranks({"mode": "static", "min_compress_numel": 0,
                    "compressor": {"type": "powersgd", "params": {"rank": 4, "classifier_rank": 64}}})
    assert ranks == {(64, 576): 4, (512, 64): 4, (10, 512): 0}


@pytest.mark.parametrize("mode", ["gravac", "auto"])
def test_modes_that_would_ignore_it_refuse_it_by_name(mode: str) -> None:
    params = {"classifier_rank": 1} if mode == "auto" else {"rank": 16, "classifier_rank": 1}
    with pytest.raises(GravacConfigError) as info:
        build_compressor(parse_config({"mode": mode, "compressor": {"type": "powersgd", "params": params}}))
    assert "compressor.params.classifier_rank" in str(info.value) and repr(mode) in str(info.value)


def test_out_of_range_names_the_key_and_the_bound() -> None:
    with pytest.raises(GravacConfigError) as info:
        build_compressor(parse_config({"mode": "static", "compressor": {"type": "powersgd",
                                                                        "params": {"classifier_rank": 0}}}))
    assert "classifier_rank" in str(info.value) and "1" in str(info.value)
