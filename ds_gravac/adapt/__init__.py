"""Controllers: they decide (StepDecision), the synchronizer executes."""
from __future__ import annotations

from ..config import GravacConfig
from ..errors import GravacConfigError
from .base import AgreedStats, Controller, ControllerContext, StepDecision
from .static import DenseController, StaticController


def build_controller(config: GravacConfig) -> Controller:
    """Controller for ``config.mode``."""
    if config.mode == "dense":
        return DenseController(config)
    if config.mode == "static":
        return StaticController(config)
    if config.mode == "gravac":
        try:
            from .gravac import GravacController
        except ImportError:
            raise GravacConfigError("ds_gravac: mode 'gravac' is not available in this build yet; "
                                    "use mode 'static' or 'dense'") from None
        return GravacController(config)
    if config.mode == "accordion":
        try:
            from .accordion import AccordionController
        except ImportError:
            raise GravacConfigError("ds_gravac: mode 'accordion' is not available in this build yet; "
                                    "use mode 'static' or 'dense'") from None
        return AccordionController(config)
    if config.mode == "auto":
        from .auto.controller import AutoController
        return AutoController(config)
    raise GravacConfigError(f"ds_gravac: unknown mode {config.mode!r}")


__all__ = ["AgreedStats", "Controller", "ControllerContext", "StepDecision", "build_controller"]
