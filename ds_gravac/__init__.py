"""ds_gravac: compressed gradient synchronization for DeepSpeed (GraVAC, Accordion, static compression).

``import ds_gravac`` never imports transformers, wandb or matplotlib.
"""
from __future__ import annotations

import logging
from typing import Any

from .version import __version__  # noqa: E402

from .compress.base import CompressCtx, Compressor, CompressorParams, Payload, Section, TensorPlan  # noqa: E402
from .compress.kinds import GainKind, Kind, LevelKind, Multilevel  # noqa: E402
from .compress.registry import register_compressor  # noqa: E402
from .errors import GravacConfigError, GravacError, GravacUnsupportedError  # noqa: E402
from .config_aliases import GravacDeprecationWarning  # noqa: E402
from .integration.engine import GravacHandle, attach, get_handle  # noqa: E402


def _deepspeed_initialize() -> Any:
    """DeepSpeed's own ``initialize``, captured once: a script that replaced ``deepspeed.initialize`` with ours
    must not make it call itself."""
    global _DS_INITIALIZE
    if _DS_INITIALIZE is None:
        import deepspeed
        _DS_INITIALIZE = deepspeed.initialize
    return _DS_INITIALIZE


_DS_INITIALIZE: Any = None
_deepspeed_initialize()


def initialize(*args: Any, gravac: Any = None, **kwargs: Any) -> tuple:
    """Drop-in for ``deepspeed.initialize``: same arguments, same 4-tuple, gradient sync taken over.

    Before DeepSpeed broadcasts the parameters, the ranks compare their parameter lists: a model that differs
    between ranks is a clear error on every rank instead of a gloo size mismatch or a hang inside DeepSpeed."""
    return _initialize(args, kwargs, gravac, require_section=True)


def _initialize(args: tuple, kwargs: dict, gravac: Any, require_section: bool) -> tuple:
    """``initialize``; with ``require_section`` false (``ds_gravac.launch``), an engine whose config has no
    ``"gravac"`` section is returned untouched instead of refused."""
    from deepspeed.utils import log_dist

    from .integration.engine import NO_SECTION, _resolve_section, no_section_warning
    from .integration.init_check import check_models_before_broadcast, declares_gravac
    ds_initialize = _deepspeed_initialize()
    if require_section or gravac is not None or declares_gravac(ds_initialize, args, kwargs):
        check_models_before_broadcast(ds_initialize, args, kwargs)
    result = ds_initialize(*args, **kwargs)
    engine = result[0]
    try:
        _resolve_section(engine, gravac)
    except GravacConfigError:
        if not require_section:
            log_dist(no_section_warning(engine), ranks=[0], level=logging.WARNING)
            return result
        raise GravacConfigError(NO_SECTION) from None
    attach(engine, config=gravac)
    return result


def detach(engine: Any) -> None:
    handle = get_handle(engine)
    if handle is not None:
        handle.detach()


def __getattr__(name: str) -> Any:
    if name == "GravacCallback":
        try:
            from .integration.hf import GravacCallback
        except ImportError as exc:
            raise ImportError("ds_gravac.GravacCallback needs transformers and accelerate: "
                              "install ds_gravac with its [hf] extra (pip install '/path/to/ds_gravac[hf]')") from exc
        return GravacCallback
    raise AttributeError(f"module 'ds_gravac' has no attribute {name!r}")


__all__ = ["initialize", "attach", "detach", "get_handle", "register_compressor", "GravacHandle",
           "GravacDeprecationWarning", "Compressor", "CompressorParams", "CompressCtx", "Kind", "LevelKind",
           "GainKind", "Multilevel", "Payload", "Section", "TensorPlan", "GravacError", "GravacConfigError",
           "GravacUnsupportedError", "__version__"]
