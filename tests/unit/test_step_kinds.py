"""A run priced per kind of step: each kind at its median measured step, times the run's count of that kind."""
from __future__ import annotations

import pytest

from ds_gravac_bench.step_kinds import kind_prices, priced_time


def test_each_kind_takes_the_median_of_its_own_steps() -> None:
    measured = [("dense", 4.0), ("cf10", 1.0), ("dense", 5.0), ("cf10", 3.0), ("cf10", 1.5), ("dense", 4.2)]
    assert kind_prices(measured) == {"dense": {"step_s": 4.2, "n": 3}, "cf10": {"step_s": 1.5, "n": 3}}
    assert kind_prices([]) == {}


def test_a_run_costs_its_count_of_each_kind_times_that_kinds_price() -> None:
    prices = kind_prices([("dense", 4.0), ("cf10", 1.0)])
    assert priced_time({"dense": 3, "cf10": 10}, prices) == pytest.approx(3 * 4.0 + 10 * 1.0)
    assert priced_time({"dense": 0, "cf10": 10}, {"cf10": prices["cf10"]}) == pytest.approx(10.0)  # none of a kind
    assert priced_time({"dense": 3, "cf20": 1}, prices) is None          # a kind the run makes but nobody measured
