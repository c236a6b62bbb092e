"""Engine and optimizer settings ds_gravac applies itself while attached, taken out of DeepSpeed and given back.

DGC applies momentum and weight decay inside the compressor, so the optimizer runs plain SGD; DGC and
``local_clipping`` clip each rank's gradient before compression, so the engine (and its fp16/bf16/ZeRO optimizer
wrappers) clip nothing. :class:`MovedSettings` records every value it changed, so giving them back restores the
engine exactly, and a checkpoint can be written with the engine's own values (:meth:`MovedSettings.given_back`).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from ..compress.base import Compressor
from ..compress.local_clipping import local_limit
from ..compress.optimizers import optimizer_chain
from ..config import GravacConfig

logger = logging.getLogger("ds_gravac")


class MovedSettings:
    """What was moved out of one engine: (object, key or attribute, the engine's value), in the order taken."""

    def __init__(self, engine: Any, config: GravacConfig, comp: Compressor, world_size: int) -> None:
        self.engine, self.config, self.comp, self.world_size = engine, config, comp, world_size
        self.hyperparams: list[tuple[dict, str, Any]] = []
        self.clipping: list[tuple[Any, str, float]] = []
        self.local_clip = 0.0              # > 0: the per-tensor norm each rank clips to (local_clipping)

    def take(self, log: bool = True) -> None:
        """Move DGC's momentum, weight decay and clipping, or ``local_clipping``'s clipping, out of the engine."""
        if self.comp.owns_optimizer:
            self._take_optimizer(log)
            self._take_clipping_into_compressor(log)
        elif self.config.local_clipping:
            self._take_clipping_local(log)

    def give_back(self) -> None:
        for group, key, value in self.hyperparams:
            group[key] = value
        for obj, attr, value in self.clipping:
            setattr(obj, attr, value)
        self.hyperparams, self.clipping = [], []

    @contextlib.contextmanager
    def given_back(self) -> Iterator[None]:
        """The engine's own momentum, weight decay and clipping for the duration of a checkpoint save or load.

        A checkpoint then records them, not the zeros they are while DGC applies them (a plain DeepSpeed run
        resuming it trains with momentum), and after a load they are taken over again from the loaded param
        groups, which ``load_state_dict`` has replaced (so a plain run's momentum is not applied twice)."""
        taken = bool(self.hyperparams or self.clipping)
        if taken:
            self.give_back()
        try:
            yield
        finally:
            if taken:
                self.take(log=False)

    def clipping_in_effect(self) -> float:
        """The threshold in effect: the compressor's when it took the engine's clipping over (the engine then
        reports 0), the engine's own under ``local_clipping`` (applied per tensor), else the engine's."""
        if self.clipping and self.comp.owns_optimizer:
            return float(self.comp.clip_norm)
        if self.clipping:
            return float(self.clipping[0][2])
        return float(self.engine.gradient_clipping() or 0.0)

    def _take_optimizer(self, log: bool) -> None:
        opt = getattr(self.engine, "basic_optimizer", None) or self.engine.optimizer
        # without the compressor's weight decay the optimizer keeps applying its own
        moved = ("momentum", "weight_decay") if self.comp.applies_weight_decay else ("momentum",)
        for group in opt.param_groups:
            for key in moved:
                if key in group:
                    self.hyperparams.append((group, key, group[key]))
                    group[key] = 0.0
        if log:
            logger.info("ds_gravac: optimizer %s set to 0; '%s' applies %s", " and ".join(moved),
                        self.config.compressor.type, "them" if len(moved) > 1 else "it")

    def _take_clipping_local(self, log: bool) -> None:
        """``local_clipping``: each rank clips its gradient per tensor at ``gradient_clipping/√N`` before
        compression (compress/local_clipping.py); the engine's clipping is off while attached."""
        clip = float(self.engine.gradient_clipping() or 0.0)
        if clip <= 0.0:
            if log:
                logger.warning("ds_gravac: local_clipping is on but gradient_clipping is 0: nothing is clipped")
            return
        self.local_clip = local_limit(clip, self.world_size)
        self._switch_off_engine_clipping()
        if log:
            logger.info("ds_gravac: gradient_clipping %g applied locally (each rank's gradient clipped per tensor to "
                        "%g before compression)", clip, self.local_clip)

    def _take_clipping_into_compressor(self, log: bool) -> None:
        """DeepSpeed clips the averaged update, which under DGC is the momentum velocity — up to 1/(1−m) times a
        gradient — so its clipping would shrink DGC's steps where dense momentum SGD clips nothing (LSTM at
        ``gradient_clipping`` 0.25: perplexity 1,020 against dense's 145). DGC clips each rank's gradient before
        its momentum instead (its paper's local clipping), at the engine's threshold unless ``clip_norm`` is set,
        and the engine's clipping is off while attached (``build.check_optimizer_takeover`` refused a compressor
        that does not clip locally: ``clips_locally``)."""
        clip = float(self.engine.gradient_clipping() or 0.0)
        if clip <= 0.0:
            return
        self.comp.take_clipping(clip)
        self._switch_off_engine_clipping()
        if log:
            logger.info("ds_gravac: gradient_clipping %g moved into '%s' (each rank's gradient clipped per tensor "
                        "to %g/sqrt(N) before its momentum)", clip, self.config.compressor.type,
                        self.comp.clip_norm)

    def _switch_off_engine_clipping(self) -> None:
        """Clipping 0 in the engine and in its fp16/bf16/ZeRO optimizer wrappers (which clip too) while attached."""
        targets = [(self.engine._config, "gradient_clipping")]
        targets += [(opt, "clip_grad") for opt in optimizer_chain(self.engine)
                    if float(getattr(opt, "clip_grad", 0.0) or 0.0) > 0.0]
        for obj, attr in targets:
            self.clipping.append((obj, attr, getattr(obj, attr)))
            setattr(obj, attr, 0.0)


__all__ = ["MovedSettings"]
