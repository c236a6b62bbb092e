"""Name → compressor class: the built-ins (listed here, imported on first lookup), plug-ins registered with
:func:`register_compressor` or the ``ds_gravac.compressors`` entry-point group, and ``"package.module:ClassName"``
paths. Built-in modules do not import this one, so there is no import circle."""
from __future__ import annotations

import importlib
import re
from importlib.metadata import entry_points
from typing import Any, Callable, Optional, TypeVar, Union

from ..errors import GravacConfigError
from .base import Compressor, check_contract

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
ENTRY_POINT_GROUP = "ds_gravac.compressors"
BUILTINS = {
    "none": "ds_gravac.compress.none:NoCompression",
    "topk": "ds_gravac.compress.topk:TopK",
    "ef21": "ds_gravac.compress.ef21:EF21",
    "randomk": "ds_gravac.compress.randomk:RandomK",
    "dgc": "ds_gravac.compress.dgc:DGC",
    "redsync": "ds_gravac.compress.redsync:RedSync",
    "sidco": "ds_gravac.compress.sidco:SIDCo",
    "threshold": "ds_gravac.compress.threshold:Threshold",
    "graddrop": "ds_gravac.compress.graddrop:GradDrop",
    "powersgd": "ds_gravac.compress.powersgd:PowerSGD",
    "acpsgd": "ds_gravac.compress.acpsgd:ACPSGD",
    "fp16": "ds_gravac.compress.fp16:FP16",
    "bf16": "ds_gravac.compress.bf16:BF16",
    "onebit": "ds_gravac.compress.onebit:OneBit",
    "signsgd": "ds_gravac.compress.signsgd:SignSGD",
    "efsignsgd": "ds_gravac.compress.efsignsgd:EFSignSGD",
    "terngrad": "ds_gravac.compress.terngrad:TernGrad",
    "ternary": "ds_gravac.compress.ternary:Ternary",
    "qsgd": "ds_gravac.compress.qsgd:QSGD",
    "tbq": "ds_gravac.compress.tbq:TBQ",
}
_REGISTRY: dict[str, type[Compressor]] = {}
_builtins_loaded = False
_entry_points_loaded = False

C = TypeVar("C", bound=type)


def register_compressor(name: str, cls: Optional[C] = None, *, overwrite: bool = False
                        ) -> Union[C, Callable[[C], C]]:
    """Register ``cls`` under ``name``; usable as a function or as a decorator."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(f"ds_gravac: compressor name {name!r} must match {NAME_RE.pattern}")

    def _register(klass: C) -> C:
        check_contract(klass)
        _load_builtins()
        if name in _REGISTRY and _REGISTRY[name] is not klass and not overwrite:
            raise ValueError(f"ds_gravac: compressor '{name}' is already registered; pass overwrite=True")
        klass.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = klass
        return klass

    return _register(cls) if cls is not None else _register


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for name, path in BUILTINS.items():
            module_name, _, attr = path.partition(":")
            cls = getattr(importlib.import_module(module_name), attr)
            check_contract(cls)
            _REGISTRY.setdefault(name, cls)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if isinstance(obj, type) and ep.name not in _REGISTRY:
            register_compressor(ep.name, obj)


def registered_names() -> list[str]:
    _load_builtins()
    _load_entry_points()
    return sorted(_REGISTRY)


def import_target(spec: str) -> Any:
    """``"package.module:attr"``: the object it names (ImportError or AttributeError when there is none)."""
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def lookup(name: str) -> type[Compressor]:
    """Resolve a config ``type``: a registered name or ``"package.module:ClassName"``."""
    _load_builtins()
    if ":" in name:
        try:
            cls = import_target(name)
        except (ImportError, AttributeError) as exc:
            raise GravacConfigError(f"ds_gravac: cannot import compressor plug-in '{name}': {exc}") from exc
        try:
            check_contract(cls)
        except TypeError as exc:
            raise GravacConfigError(str(exc)) from exc
        return cls
    if name not in _REGISTRY:
        _load_entry_points()
    if name not in _REGISTRY:
        raise GravacConfigError(
            f"ds_gravac: unknown compressor '{name}'; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
