"""Quantizer levels under the controllers, checked at attach (``ds_gravac.adapt.levels``): GraVAC's θ range over a
quantizer's grid of CFs, Accordion's two grid levels, and every combination that is refused — with the key, the
value and what to use in the message. Expected grids come from the quantizers' definitions (CF = 32/bits;
qsgd's levels 1/7/127 pack into 2/4/8 bits), not from the code under test.
"""
from __future__ import annotations

import pytest

from ds_gravac.adapt.accordion import AccordionController
from ds_gravac.adapt.base import ControllerContext
from ds_gravac.adapt.gravac import GravacController
from ds_gravac.compress.base import Compressor
from ds_gravac.compress.registry import lookup
from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError
from ds_gravac.integration.engine import build_compressor

TERNGRAD = [4.0, 8.0, 16.0, 32.0]      # bits 8, 4, 2, 1
QSGD = [4.0, 8.0, 16.0]                # levels 127, 7, 1 → codes of 8, 4, 2 bits
SINGLE = {"onebit": 32, "signsgd": 32, "efsignsgd": 32, "ternary": 16, "tbq": 16, "fp16": 2, "bf16": 2}


def refused(section: dict) -> str:
    with pytest.raises(GravacConfigError) as info:
        build_compressor(parse_config(section))
    return str(info.value)


def ctx_for(name: str, **params) -> ControllerContext:
    comp = build_compressor(parse_config({"mode": "static", "compressor": {"type": name, "params": params}}))
    return ControllerContext(world_size=2, samples_per_step=8, realize_cf=comp.realize_cf, cf_grid=comp.cf_grid(),
                             multilevel=comp.multilevel, gain_kind=comp.gain_kind, level_kind=comp.level_kind,
                             compressible=("a", "b"))


# ---- GraVAC -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SINGLE))
def test_gravac_refuses_single_level_compressors(name: str) -> None:
    """signsgd, onebit, efsignsgd and the casts also have no meaningful gain; both reasons are named."""
    msg = refused({"mode": "gravac", "compressor": name})
    assert msg.startswith("ds_gravac: mode 'gravac' needs a compressor with gain_kind 'projection' and >= 2 "
                          f"realizable CFs; '{name}' is static-only"), msg
    assert f"realizes only the CF {SINGLE[name]}" in msg and "use mode 'static')" in msg
    assert f'(keys "mode": "gravac", "compressor": "{name}")' in msg


def test_gravac_refuses_threshold_whose_level_only_bounds_the_payload() -> None:
    msg = refused({"mode": "gravac", "compressor": "threshold"})
    assert "'threshold' is static-only" in msg and "does not steer" in msg and "use mode 'static')" in msg


@pytest.mark.parametrize("name, grid", [("terngrad", TERNGRAD), ("qsgd", QSGD)])
def test_gravac_searches_the_whole_grid_by_default(name: str, grid: list) -> None:
    assert build_compressor(parse_config({"mode": "gravac", "compressor": name})).cf_grid() == grid
    ctrl = GravacController(parse_config({"mode": "gravac", "compressor": name}))
    ctrl.bind(ctx_for(name))
    assert (ctrl.theta_min, ctrl.theta_c) == (grid[0], grid[1])
    walk, floor = [], ctrl.theta_c
    while (nxt := ctrl._seq.after(floor)) is not None:
        walk.append(nxt[1])
        floor = nxt[1]
    assert [ctrl.theta_c] + walk == grid[1:], "exponential factors 2, 4, 16 from the smallest CF, capped at the top"


def test_gravac_range_set_in_the_config_snaps_up_to_the_grid() -> None:
    ctrl = GravacController(parse_config({"mode": "gravac", "compressor": "terngrad", "theta_min": 5,
                                          "theta_max": 20, "scaling_policy": "geometric"}))
    ctrl.bind(ctx_for("terngrad"))
    # θ_min 5 → 8; candidates 5·2 = 10 → 16, then 5·4 = 20 = θ_max → 32 (the smallest CF ≥ 20), end
    assert (ctrl.theta_min, ctrl.theta_c) == (8.0, 16.0)
    assert ctrl._seq.after(16.0) == (2, 32.0) and ctrl._seq.after(32.0) is None


@pytest.mark.parametrize("section, single, grid", [
    ({"compressor": "qsgd", "theta_min": 16}, "16", "4, 8, 16"),        # theta_max unset: qsgd's largest, 16
    ({"compressor": "terngrad", "theta_min": 20, "theta_max": 1000}, "32", "4, 8, 16, 32"),
])
def test_gravac_refuses_a_range_that_snaps_to_one_cf(section: dict, single: str, grid: str) -> None:
    msg = refused({"mode": "gravac", **section})
    top = f"{section['theta_max']:g}" if "theta_max" in section else "unset: 16"
    assert f"theta_min ({section['theta_min']:g}) and theta_max ({top})" in msg
    assert f"snap to the single CF {single} of compressor '{section['compressor']}', whose CFs are {grid}" in msg
    assert '"theta_min", "theta_max"' in msg and "leave both keys unset" in msg


# ---- Accordion --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SINGLE))
def test_accordion_refuses_single_level_compressors(name: str) -> None:
    msg = refused({"mode": "accordion", "compressor": name, "accordion": {"interval_steps": 5}})
    assert "mode 'accordion' switches between two compression levels" in msg
    assert f"'{name}' realizes only the CF {SINGLE[name]}; use mode 'static'" in msg
    assert f'(keys "mode": "accordion", "compressor": "{name}")' in msg


@pytest.mark.parametrize("name, grid", [("terngrad", TERNGRAD), ("qsgd", QSGD)])
def test_accordion_defaults_to_the_grid_ends(name: str, grid: list) -> None:
    config = parse_config({"mode": "accordion", "compressor": name, "accordion": {"interval_steps": 5}})
    build_compressor(config)
    ctrl = AccordionController(config)
    ctrl.bind(ctx_for(name))
    assert (ctrl.low, ctrl.high) == (grid[0], grid[-1])


def test_accordion_takes_two_grid_levels() -> None:
    config = parse_config({"mode": "accordion", "compressor": "terngrad",
                           "accordion": {"interval_steps": 5, "low_compression": 8, "high_compression": 16}})
    build_compressor(config)
    ctrl = AccordionController(config)
    ctrl.bind(ctx_for("terngrad"))
    assert (ctrl.low, ctrl.high) == (8.0, 16.0)


@pytest.mark.parametrize("name, acc, words", [
    ("terngrad", {"low_compression": 10}, "accordion.low_compression (10) is not a CF of compressor 'terngrad'; "
                                          "allowed: 4, 8, 16, 32 (key \"accordion.low_compression\")"),
    ("qsgd", {"high_compression": 32}, "accordion.high_compression (32) is not a CF of compressor 'qsgd'; "
                                       "allowed: 4, 8, 16 (key \"accordion.high_compression\")"),
    ("terngrad", {"low_compression": 16, "high_compression": 8},
     "accordion.high_compression (8) must compress at least as much as accordion.low_compression (16)"),
])
def test_accordion_refuses_levels_off_the_grid(name: str, acc: dict, words: str) -> None:
    msg = refused({"mode": "accordion", "compressor": name, "accordion": {"interval_steps": 5, **acc}})
    assert words in msg, msg


# ---- capabilities are class attributes ----------------------------------------------------------------------------
def test_capabilities_are_class_attributes() -> None:
    assert not Compressor.update_space and not Compressor.static_only
    assert lookup("efsignsgd").update_space and not lookup("onebit").update_space
    assert lookup("threshold").static_only and not lookup("topk").static_only


def test_efsignsgd_builds_in_static_mode() -> None:
    comp = build_compressor(parse_config({"mode": "static", "compressor": "efsignsgd"}))
    assert comp.name == "efsignsgd" and comp.cf_grid() == [32.0]
