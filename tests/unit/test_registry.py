"""Compressor registry (docs/design.md): names, duplicates, the contract check, plug-in lookup."""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from pydantic import BaseModel

from ds_gravac.compress import registry
from ds_gravac.compress.base import (CompressCtx, Compressor, CompressorParams, GainKind, LevelKind, Multilevel,
                                     Payload, Section, TensorPlan)
from ds_gravac.compress.registry import lookup, register_compressor, registered_names
from ds_gravac.errors import GravacConfigError


class Sketch(Compressor):
    """Minimal valid compressor used as a plug-in below (module-level so ``lookup`` can import it)."""

    def make_plan(self, numel: int, level: float) -> TensorPlan:
        return TensorPlan(numel, level, numel, (Section("val", torch.float32, numel),), numel)

    def compress(self, x: torch.Tensor, plan: TensorPlan, out: Payload, ctx: CompressCtx,
                 update_state: bool) -> Optional[torch.Tensor]:
        out["val"].copy_(x)
        return None

    def decompress(self, p: Payload, out: torch.Tensor, accumulate: bool, scale: float,
                   ctx: Optional[CompressCtx] = None) -> None:
        if not accumulate:
            out.zero_()
        out.add_(p["val"], alpha=scale)


class LooseParams(BaseModel):
    lr: float = 0.1


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A private copy of the registry (built-ins included) so tests never leak registrations."""
    registered_names()
    reg = dict(registry._REGISTRY)
    monkeypatch.setattr(registry, "_REGISTRY", reg)
    return reg


def test_builtins_are_registered() -> None:
    names = registered_names()
    for name in ("none", "topk", "ef21", "randomk", "dgc", "redsync", "sidco", "threshold", "graddrop"):
        assert name in names and lookup(name).name == name


@pytest.mark.parametrize("bad", ["", "TopK", "1topk", "top-k", "a" * 33, "with space", None])
def test_bad_names_are_rejected(bad: object, clean_registry: dict) -> None:
    with pytest.raises(ValueError, match="must match"):
        register_compressor(bad, Sketch)  # type: ignore[arg-type]


def test_function_and_decorator_forms_and_duplicates(clean_registry: dict) -> None:
    assert register_compressor("sketch_a", Sketch) is Sketch and lookup("sketch_a") is Sketch

    @register_compressor("sketch_b")
    class SketchB(Sketch):
        pass

    assert lookup("sketch_b") is SketchB
    with pytest.raises(ValueError, match="already registered"):
        register_compressor("sketch_b", Sketch)
    with pytest.raises(ValueError, match="already registered"):
        register_compressor("topk", Sketch)
    register_compressor("sketch_b", Sketch, overwrite=True)
    assert lookup("sketch_b") is Sketch
    register_compressor("sketch_a", Sketch)     # re-registering the same class is idempotent


def test_classes_failing_the_contract_are_rejected(clean_registry: dict) -> None:
    class NotACompressor:
        pass

    class NoEncode(Compressor):
        pass

    class LooseModel(Sketch):
        Params = LooseParams

    class ForbidButNotPydantic(Sketch):
        Params = dict  # type: ignore[assignment]

    class BadKind(Sketch):
        kind = "sparse"  # type: ignore[assignment]

    class BadMultilevel(Sketch):
        multilevel = "sometimes"

    class BadGain(Sketch):
        gain_kind = "maybe"

    class BadLevel(Sketch):
        level_kind = "bits"

    for cls in (NotACompressor, NoEncode, LooseModel, ForbidButNotPydantic, BadKind, BadMultilevel, BadGain,
                BadLevel):
        with pytest.raises(TypeError):
            register_compressor("broken", cls)  # type: ignore[arg-type]
    assert "broken" not in clean_registry


def test_enum_attributes_accept_their_strings(clean_registry: dict) -> None:
    """A plug-in written before the enums (plain strings) registers and compares equal to the members; a wrong
    value is refused with the allowed ones."""
    class Strings(Sketch):
        level_kind = "rank"  # type: ignore[assignment]
        multilevel = "exact"  # type: ignore[assignment]
        gain_kind = "unbiased"  # type: ignore[assignment]

    assert register_compressor("strings", Strings) is Strings
    assert (Strings.level_kind, Strings.multilevel, Strings.gain_kind) == (LevelKind.RANK, Multilevel.EXACT,
                                                                          GainKind.UNBIASED)

    class Maybe(Sketch):
        gain_kind = "maybe"  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"Maybe\.gain_kind must be a GainKind \('projection', 'unbiased', 'none'\), "
                                        r"not 'maybe'"):
        register_compressor("maybe", Maybe)


def test_declared_extension_points_have_defaults() -> None:
    """What attach and the synchronizer read of a compressor exists on every one, with the neutral default."""
    comp = Sketch()
    assert (comp.ladder, comp.shared_indices, comp.clips_locally, comp.server_error_feedback,
            comp.applies_weight_decay, comp.clip_norm, comp.default_level()) == ("cf", False, False, False, True, 0.0,
                                                                                 None)
    with pytest.raises(NotImplementedError, match="does not clip gradients itself"):
        comp.take_clipping(0.5)
    with pytest.raises(NotImplementedError, match="draws no shared indices"):
        comp.indices(4, comp.plan(4, 1.0), CompressCtx(key="k"))


def test_lookup_plugins_by_module_path() -> None:
    assert lookup(f"{__name__}:Sketch") is Sketch
    assert lookup("ds_gravac.compress.topk:TopK") is lookup("topk")
    with pytest.raises(GravacConfigError, match="cannot import"):
        lookup("no_such_module_xyz:Thing")
    with pytest.raises(GravacConfigError, match="cannot import"):
        lookup(f"{__name__}:Missing")
    with pytest.raises(GravacConfigError, match="must subclass"):
        lookup(f"{__name__}:LooseParams")


def test_unknown_name_lists_the_registered_ones() -> None:
    with pytest.raises(GravacConfigError, match="unknown compressor 'nope'; registered: .*topk"):
        lookup("nope")


def test_params_models_forbid_unknown_keys() -> None:
    for name in registered_names():
        params = lookup(name).Params
        assert issubclass(params, CompressorParams) or name == "none"
        with pytest.raises(ValueError):
            params(definitely_not_a_parameter=1)
