"""No host synchronization in the hot path beyond the written-down budget, on the path a GPU takes.

Every registered compressor trains on two real gloo ranks with ``force_device_path()`` (CPU tensors take the torch
kernels and counter-based draws a GPU would; the CPU-only numpy kernels are exempt because they never run on a
GPU), and the synchronizing calls ds_gravac makes in each steady-state step are counted
(``ds_gravac_bench.device_check_syncs``). A change that adds one fails here; the budget and its reasons are in
``BUDGET``."""
from __future__ import annotations

import pytest
import torch

from ds_gravac.compress import sparse_select as sel
from ds_gravac.compress.device_path import force_device_path
from ds_gravac_bench.device_check_syncs import BUDGET, STATS, SyncCounter
from ds_gravac_bench.device_check_train import MODES, all_names, job
from harness import run_ranks


@pytest.fixture(scope="module")
def runs() -> list:
    return run_ranks(job, 2, "cpu", all_names(), 4, 2)


def test_every_compressor_has_a_budget() -> None:
    from ds_gravac.compress.registry import registered_names
    assert set(registered_names()) | set(MODES) == set(BUDGET) == set(all_names())


@pytest.mark.parametrize("name", all_names())
def test_steady_state_syncs_within_budget(runs: list, name: str) -> None:
    for rank_result in runs:
        got = rank_result[name]
        assert "error" not in got, got.get("error")
        assert got["syncs_per_step"] <= BUDGET[name], (name, got["sync_sites"])
        if BUDGET[name]:       # the counter is live: the one statistics read of a compressed step is seen
            assert got["branch"] != "dense"
            assert sum(v for k, v in got["sync_sites"].items() if "sync/deferred.py" in k) == STATS


def test_dense_mode_is_bitwise_deepspeed_on_the_device_path(runs: list) -> None:
    for rank_result in runs:
        ref, got = rank_result["deepspeed"]["params"], rank_result["dense"]["params"]
        assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_counter_sees_syncs_in_ds_gravac_code_only() -> None:
    """The counter is not vacuous: a host read in ds_gravac's code counts, the same read in a test does not, and
    the numpy host kernels are not taken on the device path (they would count as ``numpy``)."""
    a = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    with SyncCounter() as c:
        float(a.sum())                                  # not ds_gravac's code
        with force_device_path():
            n = sel.count_ge(a, 0.5)                     # ds_gravac: int((a >= thr).sum())
            sel.topk_among(a, 10)                        # the device path's top-k: no host read
    assert n == int((a >= 0.5).sum())
    assert c.total == 1 and next(iter(c.sites)).startswith("__int__ @ compress")
    with SyncCounter() as c:
        sel.count_ge(a, 0.5)                             # host kernels: numpy views, exempt only by not being the
    assert any(k.startswith("numpy") for k in c.sites)   # GPU path — the counter still sees them
