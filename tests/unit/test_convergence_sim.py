"""The independent convergence simulation (ds_gravac_bench/convergence_sim.py) implements the update rules it
claims."""
from __future__ import annotations

import pytest
import torch

from ds_gravac_bench.convergence_sim import SimulatedRanks, run


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, rtol=0, atol=1e-12) for x, y in zip(a, b))


def test_eftopk_at_cf_1_is_dense_momentum_sgd() -> None:
    kw = dict(steps=3, ranks=2, batch=4, lr=0.05, dtype=torch.float64, every=0)
    _, dense = run("tiny_cnn", "dense", 1.0, **kw)
    _, ef = run("tiny_cnn", "eftopk", 1.0, min_numel=0, **kw)
    _, ef10 = run("tiny_cnn", "eftopk", 10.0, min_numel=0, **kw)
    assert _same(dense, ef)
    assert not _same(dense, ef10), "compression at 10x must change the trajectory"


def test_dgc_at_cf_1_with_masking_is_plain_sgd() -> None:
    # Every entry is sent and masked each step, so u restarts from g + wd·w: SGD without momentum.
    kw = dict(steps=3, ranks=2, batch=4, lr=0.05, dtype=torch.float64, every=0)
    _, plain = run("tiny_cnn", "dense", 1.0, momentum=0.0, **kw)
    _, dgc = run("tiny_cnn", "dgc", 1.0, momentum=0.9, **kw)
    assert _same(plain, dgc)


def test_error_feedback_conserves_every_gradient_value() -> None:
    # Per rank: sum of everything sent + the final residual = sum of the local gradients (nothing is lost).
    torch.manual_seed(0)
    p = torch.zeros(50, dtype=torch.float64)
    sim = SimulatedRanks([p], "eftopk", cf=10, ranks=2, lr=0.0, momentum=0.0, weight_decay=0.0, min_numel=0)
    grads = [[[torch.randn(50, dtype=torch.float64)] for _ in range(2)] for _ in range(5)]
    sent = [torch.zeros(50, dtype=torch.float64) for _ in range(2)]
    for g in grads:
        before = [sim.memory[r][0].clone() for r in range(2)]
        sim.step(g)
        for r in range(2):
            sent[r] += g[r][0] + before[r] - sim.memory[r][0]
            assert int((g[r][0] + before[r] - sim.memory[r][0] != 0).sum()) == 5   # k = 50 / 10
    for r in range(2):
        assert torch.allclose(sent[r] + sim.memory[r][0], sum(g[r][0] for g in grads), atol=1e-12)


@pytest.mark.parametrize("mode,cf", [("topk", 10.0), ("dense", 0.5)])
def test_bad_mode_or_cf_is_refused(mode: str, cf: float) -> None:
    with pytest.raises(ValueError, match="mode|cf"):
        SimulatedRanks([torch.zeros(2)], mode, cf, 2, 0.1, 0.9, 0.0, 0)


def test_dgc_at_cf_1_without_masking_is_momentum_sgd() -> None:
    # DGC: θ = 1 and momentum_masking false give momentum SGD with the same m.
    kw = dict(steps=3, ranks=2, batch=4, lr=0.05, dtype=torch.float64, every=0)
    _, dense = run("tiny_cnn", "dense", 1.0, momentum=0.9, **kw)
    _, dgc = run("tiny_cnn", "dgc", 1.0, momentum=0.9, masking=False, **kw)
    _, masked = run("tiny_cnn", "dgc", 1.0, momentum=0.9, masking=True, **kw)
    assert _same(dense, dgc)
    assert not _same(dense, masked)


@pytest.mark.parametrize("mode", ["ef21", "ef21m"])
def test_ef21_at_cf_1_is_dense_momentum_sgd(mode: str) -> None:
    # Every change is sent, so each estimate equals its rank's gradient (ef21) or momentum (ef21m) and the
    # applied mean is dense momentum SGD's; at 10x it is not.
    kw = dict(steps=3, ranks=2, batch=4, lr=0.05, dtype=torch.float64, every=0)
    _, dense = run("tiny_cnn", "dense", 1.0, **kw)
    _, at1 = run("tiny_cnn", mode, 1.0, min_numel=0, **kw)
    _, at10 = run("tiny_cnn", mode, 10.0, min_numel=0, **kw)
    assert _same(dense, at1)
    assert not _same(dense, at10)
