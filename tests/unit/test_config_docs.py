"""docs/configuration.md is the reference of the ``"gravac"`` section: every key of the schema has a row there,
and every row's default is the code's default (read from the pydantic models, not copied into this test)."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ds_gravac.config import GravacConfig, parse_config
from ds_gravac.config_aliases import RENAMED, GravacDeprecationWarning, new_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `([a-z_][a-z0-9_.]*)` \| ([^|]*) \|", re.M)
OPAQUE = ("compressor",)          # a key whose default is one object (its params are the compressor's own)


def schema_defaults(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> JSON default of every leaf of the schema."""
    out: dict[str, Any] = {}
    instance = model()
    for name in model.model_fields:
        value = getattr(instance, name)
        if isinstance(value, BaseModel) and f"{prefix}{name}" not in OPAQUE:
            out.update(schema_defaults(type(value), f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = json.loads(json.dumps(value.model_dump() if isinstance(value, BaseModel)
                                                           else value))
    return out


def documented_rows() -> list[tuple[str, str]]:
    """(key, default cell) of every table headed ``| key | default |``, compressor parameter tables excluded
    (their keys are not the section's)."""
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index("### Compressor parameters"), text.index("## Interactions at a glance")
    rows: list[tuple[str, str]] = []
    for table in re.split(r"\n(?!\|)", text[:start] + text[end:]):
        if table.lstrip("\n").startswith("| key | default |"):
            rows += ROW.findall(table)
    return rows


def first_code_value(cell: str) -> Any:
    match = re.match(r"\s*`([^`]*)`", cell)
    assert match, f"default cell without a code value: {cell!r}"
    return json.loads(match.group(1))


SCHEMA = schema_defaults(GravacConfig)


def test_every_key_of_the_schema_is_documented() -> None:
    keys = {key for key, _ in documented_rows()}
    assert sorted(set(SCHEMA) - keys) == []


@pytest.mark.parametrize("key,cell", documented_rows())
def test_documented_default_is_the_codes(key: str, cell: str) -> None:
    if key.endswith(".*") or key.startswith("compressor.params."):
        pytest.skip("a wildcard row, or a compressor's own parameter")
    assert key in SCHEMA, f"docs/configuration.md documents {key!r}, which the schema does not have"
    assert first_code_value(cell) == SCHEMA[key], key


def test_the_keys_you_will_touch_are_at_most_twelve() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("## The keys you will touch"):text.index("## Renamed keys")]
    assert 0 < len(ROW.findall(table)) <= 12


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_every_renamed_key_still_works_with_a_warning_that_names_the_new_key(old: str) -> None:
    """Each released top-level name gives the same config as its new name (value: the schema's default of the new
    key, changed where possible so a silently dropped value would show)."""
    group, key = new_name(old).split(".")
    default = SCHEMA[new_name(old)]
    value = {"theta_min": 20.0, "window": 600, "epsilon": 0.5, "agreement_check_interval": 7}.get(old, default)
    with pytest.warns(GravacDeprecationWarning, match=re.escape(f'"{group}.{key}"')):
        via_old = parse_config({old: value})
    with warnings.catch_warnings():
        warnings.simplefilter("error", GravacDeprecationWarning)
        via_new = parse_config({group: {key: value}})
    assert via_old == via_new and getattr(getattr(via_new, group), key) == value


def test_the_deprecation_warning_can_be_filtered_through_the_package() -> None:
    """Users silence renamed-key warnings with ``warnings.filterwarnings(..., ds_gravac.GravacDeprecationWarning)``."""
    import ds_gravac

    assert ds_gravac.GravacDeprecationWarning is GravacDeprecationWarning
    assert issubclass(GravacDeprecationWarning, FutureWarning)


def test_a_checkpoint_section_written_before_the_rename_compares_without_a_warning() -> None:
    """A 0.4.1 writer stored the normalized section with GraVAC's keys top-level and an unset ``cf`` as 100; read
    back it equals the same section written now (no difference reported, no deprecation warning)."""
    from ds_gravac.integration.checkpoint import _current_form

    section = {"mode": "gravac", "compressor": "topk", "gravac": {"window": 40, "refresh_steps": 5}}
    current = parse_config(section).normalized()
    old = {k: v for k, v in current.items() if k != "gravac"}
    old.update(current["gravac"], cf=100.0, agreement_check_interval=0)
    old["debug"] = {k: v for k, v in old["debug"].items() if k != "agreement_check_interval"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", GravacDeprecationWarning)
        assert _current_form(old) == current
    assert _current_form({**old, "cf": 10.0})["cf"] == 10.0       # a cf that was set stays a difference
