"""Where step records go: a JSON-lines file (cheap enough to leave on), and an active wandb run."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional


def _plain(value: Any) -> Any:
    """JSON-safe scalars: NaN/inf become null (strict JSON readers reject them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return _plain(value.item())
    return value


class JsonlSink:
    """Appends one JSON object per record; line-buffered so a killed run keeps what it logged."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._fh: Optional[Any] = open(path, "a", buffering=1, encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(_plain(record), sort_keys=True) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def numeric_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The subset of a record a metrics backend can plot (numbers, and branch as its code)."""
    out: dict[str, float] = {}
    for k, v in record.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out
