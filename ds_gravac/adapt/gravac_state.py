"""The GraVAC controller's replicated state as JSON-friendly plain Python, and its exact restore.

Kept apart from the decision logic: a checkpoint must give back bit-identical records on every rank, so this module
only converts (CF-keyed records to rows, NaN to None and back) and checks that the state belongs to this controller.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Protocol

from ..errors import GravacConfigError
from ..decision import Branch
from .gravac_records import GainRecord, Phase, ThroughputRecord, records_to_rows, rows_to_records

STATE_VERSION = 1


class GravacStateHolder(Protocol):
    """What a checkpoint holds of the GraVAC controller (``GravacController`` is one): its replicated fields.

    A protocol rather than the controller's class, so this module does not import the controller's."""

    mode: str
    alpha: float
    phase: Phase
    theta_min: float
    theta_c: float
    j: int
    i0: int
    gains: dict[float, GainRecord]
    thru: dict[float, ThroughputRecord]
    sent: list[list[Any]]
    last_decided: int
    last_observed: int
    last_boundary: int
    last_branch: Branch
    last_cf: float
    raw_min: float
    raw_cand: float
    t_iter_last: float
    t_sys_last: float
    _initialized: bool


def _saved(x: float) -> Optional[float]:
    return None if math.isnan(x) else x


def _restored(x: Any) -> float:
    return math.nan if x is None else float(x)


def gravac_state_dict(ctrl: GravacStateHolder) -> dict[str, Any]:
    """Replicated state as JSON-friendly plain Python (CF-keyed records as rows, NaN as None)."""
    return {
        "version": STATE_VERSION, "mode": ctrl.mode, "alpha": ctrl.alpha, "phase": ctrl.phase.value,
        "theta_min": ctrl.theta_min, "theta_c": ctrl.theta_c, "j": ctrl.j, "i0": ctrl.i0,
        "gains": records_to_rows(ctrl.gains), "thru": records_to_rows(ctrl.thru),
        "sent": [list(s) for s in ctrl.sent],
        "last_decided": ctrl.last_decided, "last_observed": ctrl.last_observed,
        "last_boundary": ctrl.last_boundary, "last_branch": ctrl.last_branch.value, "last_cf": ctrl.last_cf,
        "raw_min": _saved(ctrl.raw_min), "raw_cand": _saved(ctrl.raw_cand),
        "t_iter": _saved(ctrl.t_iter_last), "t_sys": _saved(ctrl.t_sys_last),
    }


def load_gravac_state(ctrl: GravacStateHolder, state: Mapping[str, Any]) -> None:
    """Exact restore (also from a JSON round trip, where NaN became None and dict keys strings)."""
    if state.get("mode", ctrl.mode) != ctrl.mode:
        raise GravacConfigError(f"ds_gravac: checkpoint holds a {state.get('mode')!r} controller state, "
                                f"not {ctrl.mode!r}")
    ctrl.alpha = float(state["alpha"])
    ctrl.phase = Phase(str(state["phase"]))
    ctrl.i0 = int(state.get("i0", ctrl.i0))
    ctrl.theta_min, ctrl.theta_c = float(state["theta_min"]), float(state["theta_c"])
    ctrl.j = int(state["j"])
    ctrl.gains = rows_to_records(state["gains"], GainRecord)
    ctrl.thru = rows_to_records(state["thru"], ThroughputRecord)
    ctrl.sent = [[int(s), float(cf), str(br)] for s, cf, br in state["sent"]]
    ctrl.last_decided, ctrl.last_observed = int(state["last_decided"]), int(state["last_observed"])
    ctrl.last_boundary = int(state["last_boundary"])
    ctrl.last_branch, ctrl.last_cf = Branch(str(state["last_branch"])), float(state["last_cf"])
    ctrl.raw_min, ctrl.raw_cand = _restored(state["raw_min"]), _restored(state["raw_cand"])
    ctrl.t_iter_last, ctrl.t_sys_last = _restored(state["t_iter"]), _restored(state["t_sys"])
    ctrl._initialized = True
