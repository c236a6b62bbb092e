"""``auto``'s replicated state as plain Python for a checkpoint, and its restore.

Kept apart from the decisions: a resumed run must plan exactly as the uninterrupted one, so this module only
converts and checks that the state belongs to this controller (same groups, same family); another model's or
compressor's state is left alone and the controller starts afresh, with an event saying why.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

from ...errors import GravacConfigError
from .ladder import LOWRANK, Group
from .refit import StepOffRule
from .signals import GroupErrors, GroupLevelErrors
from .solver import Hysteresis
from .trial import TrialCheck

STATE_VERSION = 1


class AutoStateHolder(Protocol):
    """What a checkpoint holds of ``auto`` (``AutoController`` is one); a protocol, so that this module does not
    import the controller's."""

    mode: str
    family: str
    groups: list[Group]
    codes: list[int]
    prev_codes: list[int]
    step_times: list[float]
    hyst: Hysteresis
    decisions: int
    tight_until: int
    prev_lr: Optional[float]
    tight: bool
    last: dict[str, float]
    signals: GroupErrors | GroupLevelErrors
    reproject: list[int]
    reproject_step: int
    trial: TrialCheck
    off: StepOffRule
    exact: Optional[list[int]]

    def log_event(self, step: int, kind: str, **fields: Any) -> None: ...

    def levels_changed(self) -> None: ...


def auto_state_dict(ctl: AutoStateHolder) -> dict[str, Any]:
    return {"version": STATE_VERSION, "mode": ctl.mode, "family": ctl.family,
            "groups": [g.name for g in ctl.groups],
            "codes": list(ctl.codes), "prev_codes": list(ctl.prev_codes), "step_times": list(ctl.step_times),
            "changed_at": list(ctl.hyst.changed_at), "decisions": ctl.decisions,
            "tight_until": ctl.tight_until, "prev_lr": ctl.prev_lr, "tight": ctl.tight,
            "last": dict(ctl.last), "signals": ctl.signals.state_dict(),
            "reproject": list(ctl.reproject), "reproject_step": ctl.reproject_step,
            "trial": ctl.trial.state_dict(), "off_sign": ctl.off.sign,
            "exact": None if ctl.exact is None else list(ctl.exact)}


def load_auto_state(ctl: AutoStateHolder, state: Mapping[str, Any]) -> None:
    if state.get("mode", ctl.mode) != ctl.mode:
        raise GravacConfigError(f"ds_gravac: checkpoint holds a {state.get('mode')!r} controller state, "
                                f"not {ctl.mode!r}")
    if list(state["groups"]) != [g.name for g in ctl.groups]:
        ctl.log_event(int(state["decisions"]), "auto_groups_changed")     # another model: start afresh
        return
    if state.get("family", LOWRANK) != ctl.family:       # another compressor's ladders: start afresh
        ctl.log_event(int(state["decisions"]), "auto_family_changed", saved=state.get("family", LOWRANK),
                      now=ctl.family)
        return
    ctl.codes = [int(c) for c in state["codes"]]
    ctl.prev_codes = [int(c) for c in state.get("prev_codes", ctl.codes)]
    ctl.step_times = [float(t) for t in state.get("step_times", [])]
    ctl.hyst.changed_at = [int(c) for c in state["changed_at"]]
    ctl.decisions = int(state["decisions"])
    ctl.tight_until = int(state["tight_until"])
    ctl.prev_lr = None if state["prev_lr"] is None else float(state["prev_lr"])
    ctl.tight = bool(state["tight"])
    ctl.last = {**ctl.last, **{k: float(v) for k, v in state["last"].items()}}
    ctl.signals.load_state_dict(state["signals"])
    ctl.reproject = [int(g) for g in state.get("reproject", [])]
    ctl.reproject_step = int(state.get("reproject_step", -1))
    ctl.trial.load_state_dict(state.get("trial", {}))
    ctl.off.sign = int(state.get("off_sign", 0))
    exact = state.get("exact")
    ctl.exact = None if exact is None else [int(r) for r in exact]
    ctl.levels_changed()


__all__ = ["STATE_VERSION", "AutoStateHolder", "auto_state_dict", "load_auto_state"]
