"""Linear cost fits ``T = calls·A + B·x``: the fixed cost of one call and the cost per unit of work.

Every priced primitive (an encode or decode at one level, a collective, staging, write-back) is one such line;
``x`` counts elements (codec, staging, write-back) or bytes of the per-rank input (collectives). A sample may
cover several calls at once (a bucket's encode is one call per member or partition), so the regression has two
features, the call count and the total work, and recovers the per-call ``A`` exactly from noiseless samples.

Fits are fitted per rank from that rank's timings; only the table agreed across ranks (see ``calibrate``) may
select anything.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

Sample = tuple[float, float, float]            # (calls, x, seconds)
WINDOW = 256                    # samples kept per primitive for a (re)fit: old ones leave as new ones arrive

ALL_REDUCE, ALL_GATHER, ALL_TO_ALL = "all_reduce", "all_gather", "all_to_all"
STAGE, WRITEBACK = "stage", "writeback"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL)


def encode_key(level: float) -> str:
    return f"encode@{float(level):g}"


def decode_key(level: float) -> str:
    return f"decode@{float(level):g}"


@dataclass(frozen=True)
class LinearFit:
    """``T(x) = A + B·x`` per call, in seconds; both coefficients are non-negative."""

    a: float
    b: float

    def __call__(self, x: float, calls: float = 1.0) -> float:
        return calls * self.a + self.b * x


ZERO = LinearFit(0.0, 0.0)


def least_squares(samples: Iterable[tuple[float, float, float]]) -> LinearFit:
    """Non-negative least squares of ``t ≈ calls·A + x·B`` over ``(calls, x, t)`` samples.

    With the unconstrained optimum outside ``A, B ≥ 0`` the best fit lies on a boundary, so the better of the two
    one-coefficient fits is taken. Samples that cannot separate the two coefficients (a single work size per
    call) give the proportional fit ``A = 0``, which errs on the safe side for larger sizes."""
    cc = cx = xx = ct = xt = tt = 0.0
    n = 0
    for calls, x, t in samples:
        cc, cx, xx = cc + calls * calls, cx + calls * x, xx + x * x
        ct, xt, tt = ct + calls * t, xt + x * t, tt + t * t
        n += 1
    if n == 0:
        return ZERO
    det = cc * xx - cx * cx
    only_a = LinearFit(max(0.0, ct / cc), 0.0) if cc > 0 else ZERO
    if xx <= 0:
        return only_a
    only_b = LinearFit(0.0, max(0.0, xt / xx))
    if det <= 1e-9 * cc * xx:                   # one work size per call: A and B are not separable
        return only_b
    a, b = (ct * xx - xt * cx) / det, (xt * cc - ct * cx) / det
    if a >= 0 and b >= 0:
        return LinearFit(a, b)

    def sse(f: LinearFit) -> float:
        return tt - 2 * (f.a * ct + f.b * xt) + f.a * f.a * cc + 2 * f.a * f.b * cx + f.b * f.b * xx
    return min((only_a, only_b), key=sse)


class SampleWindow:
    """The last ``size`` samples ``(calls, x, seconds)`` of one primitive."""

    def __init__(self, size: int = WINDOW) -> None:
        self.samples: collections.deque[Sample] = collections.deque(maxlen=size)

    def add(self, x: float, seconds: float, calls: float = 1.0) -> None:
        if calls > 0 and math.isfinite(seconds) and seconds >= 0:
            self.samples.append((float(calls), float(x), float(seconds)))

    def span(self) -> float:
        """Ratio of the largest to the smallest work per call (1 when fewer than two sizes)."""
        sizes = [x / c for c, x, _ in self.samples if x > 0]
        return max(sizes) / min(sizes) if sizes else 1.0

    def fit(self, extra: Sequence[tuple[float, float, float]] = ()) -> LinearFit:
        return least_squares(list(self.samples) + list(extra))

    def __len__(self) -> int:
        return len(self.samples)


class FitTable:
    """Named fits, in a fixed (sorted) order so that a table packs into the same vector on every rank."""

    def __init__(self, fits: Mapping[str, LinearFit]) -> None:
        self.fits = dict(sorted(fits.items()))

    def names(self) -> list[str]:
        return list(self.fits)

    def get(self, name: str) -> LinearFit:
        return self.fits.get(name, ZERO)

    def codec(self, kind: str, level: float) -> LinearFit:
        """The encode/decode fit of ``level``, else of the nearest fitted level (in log scale; ties: the
        lower level) — a pure function of the table, so every rank picks the same one."""
        exact = self.fits.get(f"{kind}@{float(level):g}")
        if exact is not None:
            return exact
        fitted = [(float(name.split("@", 1)[1]), f) for name, f in self.fits.items() if name.startswith(kind + "@")]
        if not fitted:
            return ZERO
        target = math.log(max(float(level), 1e-30))
        return min(fitted, key=lambda lf: (abs(math.log(max(lf[0], 1e-30)) - target), lf[0]))[1]

    def flat(self) -> list[float]:
        """``[A0, B0, A1, B1, ...]`` in name order (what the ranks reduce)."""
        return [v for f in self.fits.values() for v in (f.a, f.b)]

    @classmethod
    def from_flat(cls, names: Sequence[str], values: Sequence[float]) -> "FitTable":
        return cls({n: LinearFit(max(0.0, float(values[2 * i])), max(0.0, float(values[2 * i + 1])))
                    for i, n in enumerate(names)})

    def as_dict(self) -> dict[str, tuple[float, float]]:
        return {n: (f.a, f.b) for n, f in self.fits.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FitTable) and self.fits == other.fits

    def __repr__(self) -> str:
        return f"FitTable({self.as_dict()!r})"

