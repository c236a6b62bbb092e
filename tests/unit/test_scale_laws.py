"""The scale model's collective laws and step lines against hand computations (no process group)."""
from __future__ import annotations

import math

import pytest

from ds_gravac_bench.scale_laws import Collectives, Law, fit_law, steps, wire_factor
from ds_gravac_bench.scale_model import Kernels, bytes_sent, predict_step

ALPHA, BETA = 2e-4, 8.5e-8          # 0.2 ms per message, ~94 Mbit/s


def hand(op: str, n: int, x: float) -> float:
    """Textbook times written out: ring all-reduce, ring all-gather, pairwise all-to-all."""
    if op == "all_reduce":
        return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * BETA * x
    if op == "all_gather":
        return (n - 1) * ALPHA + (n - 1) * BETA * x
    return (n - 1) * ALPHA + (n - 1) / n * BETA * x


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "all_to_all"])
def test_law_matches_hand_computation(op: str) -> None:
    law = Law(op, ALPHA, BETA)
    for n in (2, 3, 4, 8, 64):
        assert law(n, 3e6) == pytest.approx(hand(op, n, 3e6), rel=1e-12)
    # ring all-reduce of 45 MB at 4 ranks: 6 latencies + 1.5 x the bytes
    assert Law("all_reduce", ALPHA, BETA)(4, 45e6) == pytest.approx(6 * 2e-4 + 1.5 * 8.5e-8 * 45e6)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "all_to_all"])
def test_law_is_monotonic_in_n(op: str) -> None:
    law = Law(op, ALPHA, BETA)
    times = [law(n, 1e6) for n in range(2, 129)]
    assert all(b > a for a, b in zip(times, times[1:]))
    assert steps(op, 1) == wire_factor(op, 1) == 0.0


def test_all_gather_bytes_grow_with_n_minus_one_and_ring_stays_bounded() -> None:
    gather = [{"exchange": "allgather", "numel": 10**6, "words1": 2 * 10**4, "words2": 0, "calls": 1}]
    dense = [{"exchange": "dense", "numel": 10**6, "words1": 10**6, "words2": 0, "calls": 1}]
    per = {n: bytes_sent(gather, n) / (n - 1) for n in (2, 3, 8, 64)}
    assert len({round(v) for v in per.values()}) == 1 and per[2] == 4 * 2 * 10**4
    assert bytes_sent(dense, 64) == pytest.approx(2 * 63 / 64 * 4e6) and bytes_sent(dense, 64) < 8e6
    ps = [{"exchange": "casync_ps", "numel": 10**6, "words1": 2.5e5, "words2": 0, "calls": 4}]
    assert bytes_sent(ps, 4) == pytest.approx(2 * 3 * 4 * 2.5e5 / 4)


def test_fit_law_recovers_alpha_beta_from_probes_at_several_n() -> None:
    sizes = (2**18, 2**21, 2**23)
    probes = {n: [(x, hand("all_gather", n, x)) for x in sizes] for n in (2, 3, 4)}
    law = fit_law("all_gather", probes)
    assert law.alpha == pytest.approx(ALPHA, rel=1e-6) and law.beta == pytest.approx(BETA, rel=1e-9)


def test_measured_n_keeps_its_own_line_other_n_use_the_law() -> None:
    ops = ("all_reduce", "all_gather", "all_to_all")
    sizes = (2**18, 2**21, 2**23)
    probes = {n: {op: [(x, hand(op, n, x) * (1.3 if n == 2 and op == "all_gather" else 1.0)) for x in sizes]
                  for op in ops} for n in (2, 3, 4)}
    coll = Collectives.from_probes(probes)
    own = coll.fit("all_gather", 2)
    assert own.b == pytest.approx(1.3 * BETA, rel=1e-6)           # the slow two-rank gather is kept as measured
    assert coll.law_ns == (3, 4)                                   # the law leaves the two-rank probes out
    assert coll.fit("all_gather", 2, law_only=True).b == pytest.approx(BETA, rel=1e-6)
    only_two = Collectives.from_probes({2: probes[2]})             # nothing from three ranks on: all N
    assert only_two.law_ns == (2,) and only_two.laws["all_gather"].beta == pytest.approx(1.3 * BETA, rel=1e-6)
    law8 = coll.fit("all_reduce", 8)
    assert law8.a == pytest.approx(14 * ALPHA, rel=1e-3) and law8.b == pytest.approx(1.75 * BETA, rel=1e-3)


def test_step_lines_against_hand_computation() -> None:
    sizes = (2**18, 2**21, 2**23)
    ops = ("all_reduce", "all_gather", "all_to_all")
    coll = Collectives.from_probes({n: {op: [(x, hand(op, n, x)) for x in sizes] for op in ops} for n in (2, 3)})
    k = Kernels(compute_s=0.05, stage=1e-9, writeback=2e-9, encode=3e-9, decode=4e-9)
    m, w, n = 10**6, 2.5 * 10**5, 16
    ps = [{"exchange": "casync_ps", "numel": m, "words1": w, "words2": 0, "calls": n}]
    got = predict_step(k, ps, coll, n)
    comm = hand("all_to_all", n, 4 * w) + hand("all_gather", n, 4 * w / n)
    codec = (1e-9 + 2e-9) * m + 3e-9 * m + 3e-9 * m / n + 2 * 4e-9 * m   # edges, encode, owner re-encode, 2 decodes
    assert got["comm"] == pytest.approx(comm, rel=1e-4) and got["codec"] == pytest.approx(codec, rel=1e-4)
    assert got["step"] == pytest.approx(0.05 + comm + codec, rel=1e-4)
    lowrank = [{"exchange": "two_round", "numel": m, "words1": 1e4, "words2": 5e3, "calls": 3}]
    got = predict_step(k, lowrank, coll, n)
    assert got["comm"] == pytest.approx(hand("all_reduce", n, 4e4) + hand("all_reduce", n, 2e4), rel=1e-4)
    assert got["codec"] == pytest.approx((1e-9 + 2e-9 + 3e-9 + 4e-9) * m, rel=1e-6)
    gather = [{"exchange": "allgather", "numel": m, "words1": 2e4, "words2": 0, "calls": 2}]
    a, b = (predict_step(k, gather, coll, q) for q in (8, 64))
    assert b["codec"] - a["codec"] == pytest.approx(56 * 4e-9 * m, rel=1e-6)   # one row decoded per rank
    assert math.isclose(a["compute"], 0.05)
