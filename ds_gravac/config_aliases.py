"""Deprecated names of ``"gravac"`` keys, DeepSpeed-style: a released key keeps working, with a warning that names
its new key, until it is removed in a later minor version (docs/configuration.md, "Renamed keys").

A key given under both its old and its new name is an error, not a silent choice between them.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping

from .errors import GravacConfigError

GRAVAC_MODE_KEYS = ("theta_min", "theta_max", "epsilon", "omega", "window", "scaling_policy", "step_size",
                    "ewma_alpha", "ewma_alpha_range", "gain_ewma", "gain_denominator", "rank_ladder", "decision",
                    "decision_source", "stale_policy", "refresh_steps", "min_sent_steps", "settled_policy")

# old top-level key -> (new object, key inside it), with the version that renamed it
RENAMED: dict[str, tuple[str, str, str]] = {
    **{key: ("gravac", key, "0.5.0") for key in GRAVAC_MODE_KEYS},
    "agreement_check_interval": ("debug", "agreement_check_interval", "0.5.0"),
}


class GravacDeprecationWarning(FutureWarning):
    """A config key or value that still works but will be removed (a FutureWarning: shown by default)."""


def new_name(old: str) -> str:
    """The dotted key that replaced a deprecated top-level key."""
    group, key, _ = RENAMED[old]
    return f"{group}.{key}"


def migrate(section: Mapping[str, Any], warn: bool = True) -> dict[str, Any]:
    """A copy of ``section`` with every deprecated top-level key moved to its new place (never mutates the input).

    An object the keys move into that is not a mapping is left alone: the schema reports its type."""
    out = dict(section)
    for old in [k for k in out if k in RENAMED]:
        group, key, since = RENAMED[old]
        target = out.get(group, {})
        if not isinstance(target, Mapping):
            continue
        if key in target:
            raise GravacConfigError(f'ds_gravac: keys "{old}" and "{group}.{key}" are both set; "{old}" is the '
                                    f'name "{group}.{key}" had before {since}: keep only "{group}.{key}"')
        if warn:
            warnings.warn(f'ds_gravac: key "{old}" is deprecated since {since} and will be removed; write it as '
                          f'"{group}": {{"{key}": ...}} (key "{group}.{key}", same meaning)',
                          GravacDeprecationWarning, stacklevel=3)
        out[group] = {**target, key: out.pop(old)}
    return out


def renamed_location(loc: str, section: Mapping[str, Any]) -> str:
    """``loc`` of a validation error, with the deprecated key the user wrote beside its new name."""
    for old, (group, key, _) in RENAMED.items():
        if old in section and (loc == f"{group}.{key}" or loc.startswith(f"{group}.{key}.")):
            return f"{loc} (written as \"{old}\")"
    return loc


__all__ = ["GRAVAC_MODE_KEYS", "GravacDeprecationWarning", "RENAMED", "migrate", "new_name", "renamed_location"]
