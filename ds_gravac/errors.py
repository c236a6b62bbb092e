"""Exception types. Every message starts with ``ds_gravac:`` and names the offending key or feature."""
from __future__ import annotations

from typing import NoReturn


class GravacError(RuntimeError):
    """A runtime invariant was violated (e.g. ranks disagree on a plan)."""


class GravacConfigError(ValueError):
    """Something in the ``"gravac"`` section or in compressor parameters is invalid."""


class GravacUnsupportedError(RuntimeError):
    """The DeepSpeed engine uses a feature ds_gravac cannot take over safely."""


def prefixed(message: str) -> str:
    """Add the package prefix once, so callers can pass either form."""
    return message if message.startswith("ds_gravac:") else f"ds_gravac: {message}"


def unsupported(message: str) -> NoReturn:
    """Refuse an engine feature ds_gravac cannot take over (raised at attach, before any hook exists)."""
    raise GravacUnsupportedError(prefixed(message))
