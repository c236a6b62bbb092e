"""``mode: "auto"``'s config keys: each error names the key, the value and the allowed range; static keys are
refused under it; the documented defaults are the code's."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ds_gravac.adapt.auto.controller import PLAIN, AutoController
from ds_gravac.adapt.auto.ladder import LOWRANK, RANKS
from ds_gravac.config import AutoConfig, parse_config
from ds_gravac.errors import GravacConfigError
from auto_cases import SHAPES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


# ---- config ----------------------------------------------------------------------------------------------------
def test_mode_auto_is_a_choice_not_an_unset_value() -> None:
    """``"auto"`` means "not set" for every other key (Hugging Face); for ``mode`` it names the controller."""
    assert parse_config({"mode": "auto", "compressor": "powersgd"}).mode == "auto"
    assert parse_config({"cf": "auto"}).static_cf() == 100


@pytest.mark.parametrize("key, value, allowed", [
    ("interval_steps", 0, "greater than or equal to 1"),
    ("warmup_steps", -1, "greater than or equal to 0"),
    ("tight_steps", -2, "greater than or equal to 0"),
    ("dwell", 1001, "less than or equal to 1000"),
    ("min_gain", 1.0, "less than 1"),
    ("budget_quiet", 0.0, "greater than 0"),
    ("budget_tight", -0.5, "greater than or equal to 0"),
    ("pin_below_numel", -1, "greater than or equal to 0"),
    ("link_gbit_s", 0.0, "greater than 0"),
    ("link_alpha_s", 2.0, "less than or equal to 1"),
    ("link", "guess", "'measure' or 'nominal'"),
    ("interval_steps", "50", "valid integer"),
])
def test_auto_key_errors_name_key_value_and_range(key: str, value: object, allowed: str) -> None:
    with pytest.raises(GravacConfigError) as info:
        parse_config({"mode": "auto", "auto": {key: value}})
    text = str(info.value)
    assert f"key auto.{key}:" in text and allowed in text and f"input_value={value!r}" in text


def test_auto_unknown_key_and_cross_rule() -> None:
    with pytest.raises(GravacConfigError, match=r"(?s)key auto\.interval: .*Extra inputs are not permitted"):
        parse_config({"mode": "auto", "auto": {"interval": 5}})
    with pytest.raises(GravacConfigError, match=r"auto\.budget_tight \(2\) must be <= auto\.budget_quiet \(1\)"):
        parse_config({"mode": "auto", "auto": {"budget_tight": 2.0}})


@pytest.mark.parametrize("compressor", ["qsgd", "topk"])
def test_shared_buckets_need_a_low_rank_compressor(compressor: str) -> None:
    """A quantizer or a sparsifier encodes a bucket at one level: ``auto.buckets: "shared"`` is refused before
    training, naming the key, the value and what is allowed; over PowerSGD it asks for groups that share buckets."""
    with pytest.raises(GravacConfigError, match=r"auto\.buckets 'shared' needs a low-rank compressor .*"
                                                rf"{compressor!r}.*allowed with it: 'groups'"):
        parse_config({"mode": "auto", "compressor": compressor, "auto": {"buckets": "shared"}})
    shapes = [("a.weight", (64, 64, 3, 3)), ("b.weight", (128, 64, 3, 3)), ("fc.weight", (10, 128))]
    for buckets, bucketed in (("groups", True), ("shared", False)):
        ctl = AutoController(parse_config({"mode": "auto", "compressor": "powersgd", "auto": {"buckets": buckets}}))
        assert ctl.signal_groups(shapes).bucketed is bucketed, buckets


def test_auto_refuses_other_compressors_at_attach() -> None:
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError, match=r"mode 'auto' .* supports powersgd, qsgd, topk .* not 'randomk' .*\"compressor\""):
        build_compressor(parse_config({"mode": "auto", "compressor": "randomk"}))
    with pytest.raises(GravacConfigError, match=r'key "compressor.params.rank" \(8\) is not read by mode .auto.'):
        build_compressor(parse_config({"mode": "auto", "compressor": {"type": "powersgd", "params": {"rank": 8}}}))
    comp = build_compressor(parse_config({"mode": "auto", "compressor": "powersgd"}))
    assert (comp.level_kind, comp.bound) == ("rank", float(RANKS[0]))
    with pytest.raises(GravacConfigError, match=r'key "compressor.params.levels" \(7\) is not read by mode .auto.'):
        build_compressor(parse_config({"mode": "auto", "compressor": {"type": "qsgd", "params": {"levels": 7}}}))
    with pytest.raises(GravacConfigError, match=r'key "compressor.params.error_feedback" \(true\) is refused'):
        build_compressor(parse_config({"mode": "auto", "compressor": {"type": "qsgd",
                                                                      "params": {"error_feedback": True}}}))
    assert build_compressor(parse_config({"mode": "auto", "compressor": "qsgd"})).name == "qsgd"


@pytest.mark.parametrize("section, key", [({"compressor": "topk", "cf": 10}, "cf"),
                                          ({"compressor": "powersgd", "warmup_steps": 20}, "warmup_steps")])
def test_static_keys_are_refused_under_auto_not_ignored(section: dict, key: str) -> None:
    """``cf`` and the top-level ``warmup_steps`` are static mode's; auto never read them, so a user who set them
    trained without what they asked for. Attach refuses them and names auto's own key where there is one."""
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError, match=rf'key "{key}" .* is static mode.s and is not read by mode .auto.'):
        build_compressor(parse_config({"mode": "auto", **section}))
    assert build_compressor(parse_config({"mode": "static", **section})).name == section["compressor"]
    assert "defaults to 'auto'" not in str(pytest.raises(GravacConfigError, build_compressor,
                                                         parse_config({"mode": "auto", **section})).value)
    with pytest.raises(GravacConfigError, match=rf'key "{key}" .* remove it; "mode" is not set and defaults to '
                                                r"'auto' since 0.5: set \"mode\": \"static\""):
        build_compressor(parse_config(section))       # a 0.4 section that relied on the static default


def test_a_compressor_auto_does_not_drive_names_the_default_mode() -> None:
    from ds_gravac.integration.engine import build_compressor

    with pytest.raises(GravacConfigError, match=r"not 'dgc'.*\"mode\" is not set and defaults to 'auto'"):
        build_compressor(parse_config({"compressor": "dgc"}))
    assert build_compressor(parse_config({"mode": "static", "compressor": "dgc"})).name == "dgc"


def test_the_dense_rung_sends_a_matrix_plain_and_a_rank_rung_at_its_rank() -> None:
    """What PowerSGD, bound by auto's mode, makes of the levels the controller gives a tensor."""
    from ds_gravac.adapt.auto.ladder import build_groups
    from ds_gravac.integration.engine import build_compressor

    comp = build_compressor(parse_config({"mode": "auto", "compressor": "powersgd"}))
    for group in build_groups(SHAPES, families=(LOWRANK,)):
        n, m = group.shape
        plain = comp.tensor_plan((n, m), PLAIN)
        assert (plain.get("rank"), plain.words) == (0, n * m), group.name          # its values, no factors
        for level in group.ladder[1:]:
            assert comp.tensor_plan((n, m), level.value).get("rank") == int(level.value), (group.name, level)


def test_the_default_dense_start_is_one_interval() -> None:
    """Since 0.5 ``{}`` sends steps 0-49 dense and decides first at step 50: without that start ``auto`` and its
    reference rank 16 ended outside the bounds on VGG16-bn (docs/algorithms.md §8, "On the short tasks")."""
    ctl = AutoController(parse_config({}))
    assert (ctl.start, ctl.interval) == (50, 50)
    assert [s for s in range(151) if ctl.broadcast_point(s)] == [50, 100, 150]
    assert all(ctl.measures(s) for s in range(50))              # exact ranks read the whole dense start
    assert AutoController(parse_config({"auto": {"warmup_steps": 0}})).start == 2


def test_documented_auto_defaults_are_the_codes() -> None:
    """Every ``auto.*`` row of docs/configuration.md states the default the schema has."""
    rows = re.findall(r"^\| `auto\.(\w+)` \| `([^`]+)`", DOCS.read_text(), flags=re.M)
    documented = {k: v for k, v in rows}
    assert set(documented) == set(AutoConfig.model_fields)
    for key, field in AutoConfig.model_fields.items():
        assert json.loads(documented[key]) == field.default, key
