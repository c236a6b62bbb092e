"""Malformed ``"gravac"`` sections, generated: every one ends in a GravacConfigError that names the offending key.

Cases are built from the schema itself (every leaf key of GravacConfig and its sections, with its type and
bounds), so a key added later is fuzzed too. Each case is validated the way attach validates it:
``parse_config`` and then the compressor's own parameters (``build_compressor``). Never another exception,
never silent acceptance. Also: settings the schema accepts but this version cannot honour are refused by name.
"""
from __future__ import annotations

import collections
import copy
import math
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ds_gravac.config import GravacConfig, parse_config, unavailable_settings
from ds_gravac.errors import GravacConfigError, GravacUnsupportedError
from ds_gravac.integration.engine import build_compressor, reject_unimplemented

# compressors whose attach-time checks pass with a plain config (DGC needs every tensor compressed, a separate rule)
VALID_BASE: dict[str, Any] = {"mode": "static", "compressor": "topk", "cf": 10}


@dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]
    annotation: Any
    bounds: tuple[Any, ...]


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[Leaf]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_leaves(ann, prefix + (name,)))
        else:
            out.append(Leaf(prefix + (name,), ann, tuple(info.metadata)))
    return out


LEAVES = _leaves(GravacConfig)
SECTIONS = [()] + sorted({leaf.path[:-1] for leaf in LEAVES if len(leaf.path) > 1})


def _base(ann: Any) -> tuple[Any, bool]:
    """(annotation without Optional, whether None is allowed)."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return ann, False


def _kind(ann: Any) -> str:
    base, _ = _base(ann)
    origin = typing.get_origin(base)
    if origin is Literal:
        return "literal"
    if origin in (list, dict) or base in (list, dict):
        return (origin or base).__name__
    return base.__name__          # bool, int, float, str


def wrong_values(leaf: Leaf) -> list[Any]:
    """Values of another JSON type than the key takes (strict: "10" is no number, true is no float)."""
    base, optional = _base(leaf.annotation)
    kind = _kind(leaf.annotation)
    pool: dict[str, list[Any]] = {
        "bool": ["true", "false", 1, 0, 1.0, [], {}],
        "int": ["10", 10.5, 10.0, True, [1], {"v": 1}],
        "float": ["10", "1e3", True, False, [1.0], {"v": 1.0}],
        "str": [10, 1.5, True, ["topk"], {"x": 1}],
        "literal": [1, 2.5, True, "", "nonsense", ["x"], {"x": 1}],
        "list": ["0.1,0.5", 0.5, {"lo": 0.1}, True],
        "dict": ["k=1", 3, [1, 2], True],
    }
    values = list(pool[kind])
    if not optional:
        values.append(None)
    if kind == "literal":
        allowed = typing.get_args(base)
        values = [v for v in values if v not in allowed]
    return values


def out_of_range(leaf: Leaf) -> list[Any]:
    """Values just outside the key's bounds, plus NaN and infinities for floats."""
    kind = _kind(leaf.annotation)
    values: list[Any] = []
    for b in leaf.bounds:
        if isinstance(b, annotated_types.Ge):
            values += [b.ge - 1, b.ge - 1e-3 if kind == "float" else b.ge - 1]
        elif isinstance(b, annotated_types.Gt):
            values += [b.gt, b.gt - 1]
        elif isinstance(b, annotated_types.Le):
            values += [b.le + 1]
        elif isinstance(b, annotated_types.Lt):
            values += [b.lt, b.lt + 1]
    if kind == "float":
        values += [math.nan, math.inf, -math.inf]
    return [int(v) if kind == "int" else float(v) for v in values]


RANGED = [leaf for leaf in LEAVES if out_of_range(leaf)]
CROSSED: list[tuple[dict[str, Any], str]] = [
    ({"theta_min": 100.0, "theta_max": 100.0}, "theta_min"),
    ({"theta_min": 500.0, "theta_max": 20.0}, "theta_max"),
    ({"window": 30, "refresh_steps": 20}, "refresh_steps"),
    ({"window": 1, "refresh_steps": 1}, "window"),
    ({"accordion": {"interval_steps": 5, "accum_steps": 6}}, "accum_steps"),
    ({"mode": "accordion"}, "interval_steps"),
    ({"ewma_alpha_range": [0.5, 0.1]}, "ewma_alpha_range"),
    ({"ewma_alpha_range": [0.0, 0.5]}, "ewma_alpha_range"),
    ({"ewma_alpha_range": [0.1, 0.2, 0.3]}, "ewma_alpha_range"),
    ({"ewma_alpha_range": []}, "ewma_alpha_range"),
    ({"cost_model": {"probe_bytes": [4096, 4096]}}, "probe_bytes"),
    ({"cost_model": {"probe_bytes": [16, 4096]}}, "probe_bytes"),
    ({"compressor": {"type": "topk", "params": {"algorithm": "fastest"}}}, "algorithm"),
    ({"compressor": {"type": "topk", "params": {"bogus": 1}}}, "bogus"),
    ({"compressor": {"type": "no_such_compressor"}}, "no_such_compressor"),
    ({"compressor": ""}, "compressor"),
]


@dataclass(frozen=True)
class Case:
    category: str
    section: Any
    key: str


def _set(section: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(section)
    node = out
    for part in path[:-1]:
        nxt = node.get(part)
        node[part] = nxt = dict(nxt) if isinstance(nxt, dict) else {}
        node = nxt
    node[path[-1]] = value
    return out


def _leaf_case(category: str, values_of: Any) -> st.SearchStrategy[Case]:
    leaves = RANGED if category == "out_of_range" else LEAVES
    return st.sampled_from(leaves).flatmap(
        lambda leaf: st.sampled_from(values_of(leaf)).map(
            lambda v: Case(category, _set(VALID_BASE, leaf.path, v), leaf.path[-1])))


KNOWN_NAMES = {leaf.path[-1] for leaf in LEAVES} | {p for sec in SECTIONS for p in sec}


def _misspellings(name: str) -> list[str]:
    """Typos of a real key that a lenient parser might map onto it: case, dashes, no underscores, spaces."""
    return [name.upper(), name.capitalize(), name.replace("_", "-"), name.replace("_", ""), name + " ", " " + name]


_unknown_names = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12),
    st.sampled_from(sorted(KNOWN_NAMES)).flatmap(lambda n: st.sampled_from(_misspellings(n))),
).filter(lambda s: s not in KNOWN_NAMES and s != "auto")

unknown_key = st.tuples(st.sampled_from(SECTIONS), _unknown_names, st.sampled_from([1, "x", None, {}, [1]])).map(
    lambda t: Case("unknown_key", _set(VALID_BASE, t[0] + (t[1],), t[2]), t[1]))
nesting = st.one_of(
    st.sampled_from([s for s in SECTIONS if s]).flatmap(lambda sec: st.sampled_from([1, "x", [1, 2], True, None]).map(
        lambda v: Case("nesting", _set(VALID_BASE, sec, v), sec[-1]))),
    st.sampled_from([leaf for leaf in LEAVES if _kind(leaf.annotation) not in ("dict", "list")]).map(
        lambda leaf: Case("nesting", _set(VALID_BASE, leaf.path, {"value": 1}), leaf.path[-1])),
)


def _empties(leaf: Leaf) -> list[Any]:
    """null where the key is not Optional; empty or blank strings, lists and objects where they mean nothing."""
    kind, optional = _kind(leaf.annotation), _base(leaf.annotation)[1]
    values: list[Any] = ["", "  "] + ([] if optional else [None, [], {}])
    return [v for v in values if not (v == {} and kind == "dict")]


null_or_empty = st.sampled_from(LEAVES).flatmap(
    lambda leaf: st.sampled_from(_empties(leaf)).map(
        lambda v: Case("null_or_empty", _set(VALID_BASE, leaf.path, v), leaf.path[-1])))
empty_key = st.sampled_from(SECTIONS).map(lambda sec: Case("unknown_key", _set(VALID_BASE, sec + ("",), 1), "''"))
crossed = st.sampled_from(CROSSED).map(lambda c: Case("crossed", {**VALID_BASE, **c[0]}, c[1]))
wrong_type = _leaf_case("wrong_type", wrong_values)
ranged = _leaf_case("out_of_range", out_of_range)
def _param_cases() -> list[Case]:
    """Wrong types and out-of-range values of every built-in compressor's own parameters."""
    from ds_gravac.compress.registry import BUILTINS, lookup
    out = []
    for name in sorted(BUILTINS):
        for leaf in _leaves(lookup(name).Params):
            for value in wrong_values(leaf) + out_of_range(leaf):
                out.append(Case("compressor_params", {**VALID_BASE, "min_compress_numel": 0,
                                                      "compressor": {"type": name, "params": {leaf.path[-1]: value}}},
                                leaf.path[-1]))
    return out


PARAM_CASES = _param_cases()
compressor_params = st.sampled_from(PARAM_CASES)
whole_section = st.sampled_from([[], "gravac", 3, True]).map(lambda v: Case("whole_section", v, "gravac"))
CASES = st.one_of(wrong_type, ranged, crossed, unknown_key, empty_key, nesting, null_or_empty, whole_section,
                  compressor_params)


def validate_as_attach(section: Any) -> None:
    build_compressor(parse_config(section))


def test_generated_malformed_sections_are_refused_by_name() -> None:
    counts: collections.Counter[str] = collections.Counter()

    @settings(max_examples=800, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=CASES)
    def check(case: Case) -> None:
        counts[case.category] += 1
        with pytest.raises(GravacConfigError) as info:
            validate_as_attach(case.section)
        assert case.key in str(info.value), (case, str(info.value))

    check()
    total = sum(counts.values())
    print(f"\n[config fuzz] {total} malformed sections, all refused naming the key: {dict(sorted(counts.items()))}")
    assert total >= 500 and len(counts) == 8, counts


def test_fuzz_strategies_are_not_vacuous() -> None:
    """The same builders with in-range values are accepted, so the refusals above come from the bad value."""
    validate_as_attach(VALID_BASE)
    for leaf in LEAVES:
        assert wrong_values(leaf), leaf
    assert len(RANGED) >= 15


UNAVAILABLE: list[tuple[dict[str, Any], str, str]] = [      # (section, key and value, what to do instead)
    ({"decision_source": "rank0"}, "decision_source 'rank0'", "the default 'allreduce'"),
    ({"telemetry": {"timing": False}}, "telemetry.timing false", "remove the key"),
]
WITHOUT_EFFECT: list[tuple[dict[str, Any], str, str]] = [   # keys that only act under another setting
    ({"cost_model": {"margin": 0.5}}, "cost_model.margin 0.5", "remove the cost_model section"),
    ({"cost_model": {"calibrate": True, "probe_repeats": 3}}, "cost_model.calibrate true, cost_model.probe_repeats 3",
     "set \"selection\": \"cost_model\""),
]


@pytest.mark.parametrize("section, key, instead", UNAVAILABLE, ids=[u[1] for u in UNAVAILABLE])
def test_settings_without_effect_are_refused(section: dict[str, Any], key: str, instead: str) -> None:
    """A key that is accepted but does nothing would let a run silently differ from what its config says."""
    config = parse_config({**VALID_BASE, **section})
    with pytest.raises(GravacUnsupportedError, match="not available in this version") as info:
        reject_unimplemented(config)
    assert key in str(info.value) and instead in str(info.value), str(info.value)


@pytest.mark.parametrize("section, key, instead", WITHOUT_EFFECT, ids=[u[1] for u in WITHOUT_EFFECT])
def test_cost_model_keys_need_cost_model_selection(section: dict[str, Any], key: str, instead: str) -> None:
    with pytest.raises(GravacUnsupportedError, match="only used with selection 'cost_model'") as info:
        reject_unimplemented(parse_config({**VALID_BASE, **section}))
    assert key in str(info.value) and instead in str(info.value), str(info.value)
    assert unavailable_settings(parse_config({**VALID_BASE, **section, "selection": "cost_model"})) == []


AUTO_MEASURING: dict[str, Any] = {"mode": "auto", "compressor": "powersgd"}      # auto.link "measure" (default)


def test_auto_measuring_the_link_takes_the_probe_settings() -> None:
    """``mode: "auto"`` with ``auto.link: "measure"`` times the link at ``cost_model.probe_bytes`` and
    ``probe_repeats``: those two act without ``selection: "cost_model"`` (a loaded machine needs larger probes for
    the per-byte slope to stand above latency noise); the keys auto never reads are still refused, and so are the
    probes when the link is nominal (nothing is timed)."""
    probes = {"cost_model": {"probe_bytes": [65536, 16777216], "probe_repeats": 5}}
    assert unavailable_settings(parse_config({**AUTO_MEASURING, **probes})) == []
    with pytest.raises(GravacUnsupportedError, match="cost_model.margin 0.5: only used") as info:
        reject_unimplemented(parse_config({**AUTO_MEASURING, "cost_model": {"margin": 0.5, "probe_repeats": 5}}))
    assert "probe_repeats 5" not in str(info.value), str(info.value)      # the key it does read is not named
    nominal = {**AUTO_MEASURING, **probes, "auto": {"link": "nominal", "link_gbit_s": 1.0}}
    with pytest.raises(GravacUnsupportedError, match="cost_model.probe_bytes") as info:
        reject_unimplemented(parse_config(nominal))
    assert "auto.link 'measure'" in str(info.value), str(info.value)


def test_all_unavailable_settings_are_reported_together() -> None:
    """One attach names every such key, so fixing a config takes one round trip, not five."""
    section: dict[str, Any] = {**VALID_BASE, "decision_source": "rank0", "cost_model": {"max_chunks": 2},
                               "telemetry": {"timing": False}}
    with pytest.raises(GravacUnsupportedError) as info:
        reject_unimplemented(parse_config(section))
    for key in ("decision_source", "cost_model.max_chunks 2: only used", "telemetry.timing"):
        assert key in str(info.value), key
    assert len(unavailable_settings(parse_config(section))) == 3


@pytest.mark.parametrize("section, key", [
    ({"telemetry": {"jsonl": ""}}, "jsonl"),          # found by the fuzz: was accepted and wrote no file
    ({"telemetry": {"jsonl": "   "}}, "jsonl"),
    ({"": 1}, "''"),                                  # found by the fuzz: the message named no key
    ({"accordion": {"": 1}}, "accordion.''"),
    ({"quantized_exchange": "auto", "ewma_alpha": 0.0}, "ewma_alpha"),   # "auto" is dropped, the rest still checked
])
def test_edge_cases_name_their_key(section: dict[str, Any], key: str) -> None:
    """Pinned versions of cases the random fuzz may not draw in a given run."""
    with pytest.raises(GravacConfigError) as info:
        parse_config({**VALID_BASE, **section})
    assert key in str(info.value), str(info.value)


@pytest.mark.parametrize("section", [{}, VALID_BASE, {"cost_model": {}}, {"telemetry": {"timing": True}},
                                     {"quantized_exchange": "auto"}, {"quantized_exchange": "ps"},
                                     {"quantized_exchange": "allgather"}, {"cost_model": {"margin": "auto"}},
                                     {"selection": "threshold", "decision_source": "allreduce"},
                                     {"selection": "cost_model"}, {"selection": "cost_model", "cost_model": {
                                         "margin": 0.5, "refit_interval": 0, "max_chunks": 1}},
                                     {"selection": "cost_model", "cost_model": {"max_chunks": 4}}])
def test_defaults_and_effective_settings_pass(section: dict[str, Any]) -> None:
    assert unavailable_settings(parse_config(section)) == []


def test_shipped_configs_use_only_available_settings() -> None:
    """Every ds_configs/*.json and ds_configs/bench/*.json "gravac" section still attaches: none sets a key refused
    above."""
    import json
    from pathlib import Path
    paths = sorted((Path(__file__).resolve().parents[2] / "ds_configs").glob("**/*.json"))
    assert len(paths) >= 70
    for path in paths:
        config = parse_config(json.loads(path.read_text()).get("gravac"))
        reject_unimplemented(config)
        build_compressor(config)
