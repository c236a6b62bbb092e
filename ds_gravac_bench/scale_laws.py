"""α–β laws of the three gloo collectives the exchanges use, as a function of the world size N.

The project's cost model (``ds_gravac.sync.cost_model``) prices a collective at the run's own N as a line
``T = A + B·x`` of the per-rank input bytes ``x``. To extrapolate in N, each line is written as a number of
sequential message steps ``s(N)`` times a per-message latency ``α`` plus the bytes one rank's link carries,
``f(N)·x``, times the seconds per byte ``β`` of that link (a non-blocking switch, every rank on a link of its own):

    all-reduce (ring: reduce-scatter + all-gather)   s = 2(N−1)   f = 2(N−1)/N
    all-gather (ring)                                s = N−1      f = N−1
    all-to-all (pairwise)                            s = N−1      f = (N−1)/N

``α`` and ``β`` of an operation are fitted over the probes of the measured N ≥ 3 at once (all N if none), by
the project's own non-negative least squares (``fits.least_squares``) on relative errors: each probe ``(x, t)``
at N becomes the sample ``(s(N)/t, f(N)·x/t, 1)``. :func:`law_check` reports how far each measured N's own fit
is from the law; a measured N keeps its own fit (``per_n``), the law answers for the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ds_gravac.sync.cost_model.fits import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, LinearFit, least_squares

Probe = tuple[float, float]                    # (per-rank input bytes, seconds)
OPS = (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL)


def steps(op: str, n: int) -> float:
    """Sequential message steps of one call at N ranks (the α multiplier)."""
    if n < 2:
        return 0.0
    return {ALL_REDUCE: 2.0 * (n - 1), ALL_GATHER: n - 1.0, ALL_TO_ALL: n - 1.0}[op]


def wire_factor(op: str, n: int) -> float:
    """Bytes one rank sends per byte of its input (the β multiplier)."""
    if n < 2:
        return 0.0
    return {ALL_REDUCE: 2.0 * (n - 1) / n, ALL_GATHER: n - 1.0, ALL_TO_ALL: (n - 1.0) / n}[op]


@dataclass(frozen=True)
class Law:
    """``T(N, x) = s(N)·alpha + f(N)·beta·x`` of one operation."""

    op: str
    alpha: float            # seconds per message step
    beta: float             # seconds per byte on one rank's link

    def fit_at(self, n: int) -> LinearFit:
        """The cost model's line at N ranks."""
        return LinearFit(steps(self.op, n) * self.alpha, wire_factor(self.op, n) * self.beta)

    def __call__(self, n: int, nbytes: float, calls: float = 1.0) -> float:
        return self.fit_at(n)(nbytes, calls)


def fit_law(op: str, probes: Mapping[int, Sequence[Probe]]) -> Law:
    """α and β of ``op`` from the probes of every N (relative least squares, both non-negative)."""
    samples = [(steps(op, n) / t, wire_factor(op, n) * x / t, 1.0)
               for n, rows in probes.items() for x, t in rows if t > 0 and n >= 2]
    if not samples:
        raise ValueError(f"scale: no probes of {op} to fit its law")
    line = least_squares(samples)
    return Law(op, line.a, line.b)


def fit_per_n(probes: Sequence[Probe]) -> LinearFit:
    """One N's own line (relative least squares), as the cost model would calibrate at that N."""
    return least_squares([(1.0 / t, x / t, 1.0) for x, t in probes if t > 0])


@dataclass
class Collectives:
    """Per-N lines of the measured world sizes plus the laws for every other N."""

    laws: dict[str, Law]
    per_n: dict[int, dict[str, LinearFit]]

    def fit(self, op: str, n: int, law_only: bool = False) -> LinearFit:
        own = self.per_n.get(n, {}).get(op)
        return own if own is not None and not law_only else self.laws[op].fit_at(n)

    law_ns: tuple[int, ...] = ()

    @classmethod
    def from_probes(cls, probes: Mapping[int, Mapping[str, Sequence[Probe]]], law_min_n: int = 3
                    ) -> "Collectives":
        """``probes[N][op] = [(bytes, seconds), ...]``; the laws are fitted on the N ≥ ``law_min_n`` (all N when
        none is that large): gloo's two-rank all-gather and all-to-all do not follow the ring and pairwise
        lines that hold from three ranks on (docs/SCALE.md), and the law is for extrapolating to large N."""
        ops = sorted({op for rows in probes.values() for op in rows})
        law_ns = tuple(sorted(n for n in probes if n >= law_min_n)) or tuple(sorted(probes))
        laws = {op: fit_law(op, {n: probes[n][op] for n in law_ns if op in probes[n]}) for op in ops}
        per_n = {n: {op: fit_per_n(r) for op, r in rows.items()} for n, rows in probes.items()}
        return cls(laws, per_n, law_ns)


def law_check(coll: Collectives, probes: Mapping[int, Mapping[str, Sequence[Probe]]]) -> list[dict]:
    """Per measured N and op: the law's prediction of every probe against its measured time (max |error|)."""
    rows = []
    for n in sorted(probes):
        for op, samples in sorted(probes[n].items()):
            law = coll.laws[op]
            errs = [law(n, x) / t - 1.0 for x, t in samples if t > 0]
            worst = max(errs, key=abs) if errs else 0.0
            own = coll.per_n[n][op]
            rows.append({"n": n, "op": op, "law_max_err": worst, "own_a_s": own.a, "own_b_s_per_byte": own.b,
                         "law_a_s": law.fit_at(n).a, "law_b_s_per_byte": law.fit_at(n).b})
    return rows
