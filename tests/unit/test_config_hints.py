"""Errors a newcomer meets first: a misspelled key names the documented key it resembles and where every key is
listed, a value out of range names the key's whole range, without pydantic's web links; ZeRO-3's refusal says
what to do instead."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ds_gravac.config import parse_config
from ds_gravac.errors import GravacConfigError, GravacUnsupportedError
from ds_gravac.integration.zero import validate_zero


@pytest.mark.parametrize("section, bad, meant", [
    ({"min_compress_numl": 1}, "min_compress_numl", "min_compress_numel"),
    ({"mode": "auto", "auto": {"intervl_steps": 3}}, "intervl_steps", "interval_steps"),
    ({"bucket_cap": 4}, "bucket_cap", "bucket_cap_mb"),
])
def test_a_misspelled_key_names_the_key_it_resembles(section: dict, bad: str, meant: str) -> None:
    with pytest.raises(GravacConfigError) as info:
        parse_config(section)
    text = str(info.value)
    assert f'"{bad}": did you mean "{meant}"?' in text and "docs/configuration.md" in text
    assert "Extra inputs are not permitted" in text and "errors.pydantic.dev" not in text


def test_an_unknown_key_without_a_near_match_points_to_the_docs() -> None:
    with pytest.raises(GravacConfigError) as info:
        parse_config({"zzz": 1})
    assert "did you mean" not in str(info.value) and "(every key: docs/configuration.md)" in str(info.value)


@pytest.mark.parametrize("section, says", [
    ({"bucket_cap_mb": 0}, "bucket_cap_mb allowed: > 0 and ≤ 2048"),          # pydantic names the lower bound only
    ({"bucket_cap_mb": 5000}, "bucket_cap_mb allowed: > 0 and ≤ 2048"),
    ({"mode": "auto", "auto": {"interval_steps": 0}}, "auto.interval_steps allowed: ≥ 1 and ≤ 100000"),
    ({"cf": 0.5}, "cf allowed: ≥ 1"),
])
def test_a_bad_value_names_the_whole_range_and_loses_the_link(section: dict, says: str) -> None:
    with pytest.raises(GravacConfigError) as info:
        parse_config(section)
    text = str(info.value)
    assert says in text and "errors.pydantic.dev" not in text


def test_zero3_refusal_says_what_to_do() -> None:
    with pytest.raises(GravacUnsupportedError) as info:
        validate_zero(SimpleNamespace(zero_optimization_stage=lambda: 3))
    assert "allowed: 0, 1, 2" in str(info.value) and "use stage 1 or 2" in str(info.value)
