"""Shared low-rank rules (ds_gravac.compress.lowrank), float64: matrix view, PyTorch's compression-rate rule,
shared seeded factors, and orthogonalization (against torch's own Gram-Schmidt as an independent reference)."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize_gram_schmidt

from ds_gravac.compress import lowrank as lr


def test_matrix_view_and_rank() -> None:
    assert lr.matrix_shape((64, 3, 3, 3)) == (64, 27)
    assert lr.matrix_shape((10,)) == (10, 1)
    assert lr.matrix_rank(5, 3, 4) == 3 and lr.matrix_rank(100, 200, 4) == 4
    assert lr.compression_factor(100, 200, 4) == pytest.approx(100 * 200 / (300 * 4))


@pytest.mark.parametrize("shape, rank, rate", [((64, 27), 4, 2.0), ((8, 8), 4, 2.0), ((8, 8), 1, 2.0),
                                               ((3, 1000), 4, 2.0), ((10,), 1, 1.0), ((512, 512, 1, 1), 2, 2.0)])
def test_compression_rate_rule(shape: tuple[int, ...], rank: int, rate: float) -> None:
    n = shape[0]
    m = 1
    for s in shape[1:]:
        m *= s
    r = min(rank, n, m)
    expected = len(shape) >= 2 and (n + m) * r * rate < n * m
    assert lr.worth_compressing(shape, rank, rate) == expected


def test_seeded_factors_are_shared_and_independent_of_the_global_rng() -> None:
    torch.manual_seed(1)
    a = lr.seeded_factor(0, "layer.weight", 30, 4)
    torch.manual_seed(2)
    torch.randn(100)
    b = lr.seeded_factor(0, "layer.weight", 30, 4)
    assert torch.equal(a, b) and a.dtype == torch.float32 and a.shape == (30, 4)
    assert not torch.equal(a, lr.seeded_factor(0, "other.weight", 30, 4))
    assert not torch.equal(a, lr.seeded_factor(1, "layer.weight", 30, 4))
    assert not torch.equal(a, lr.seeded_factor(0, "layer.weight", 30, 4, change=1))


@pytest.mark.parametrize("method", ["qr", "gram_schmidt"])
@pytest.mark.parametrize("shape", [(50, 4), (7, 7), (3, 20, 2)])
def test_orthonormal_columns(method: str, shape: tuple[int, ...]) -> None:
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q = lr.orthogonalize(a, method, eps=1e-12)
    eye = torch.eye(shape[-1], dtype=torch.float64).expand(q.shape[:-2] + (shape[-1], shape[-1]))
    assert torch.allclose(q.transpose(-1, -2) @ q, eye, atol=1e-10)
    # same column space as a: projecting a onto q reproduces it
    assert torch.allclose(q @ (q.transpose(-1, -2) @ a), a, atol=1e-10)


def test_gram_schmidt_matches_torch_and_qr_up_to_signs() -> None:
    a = torch.randn(2, 40, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ours = lr.orthogonalize(a, "gram_schmidt", eps=1e-8)
    ref = a.clone()
    _orthogonalize_gram_schmidt(ref, epsilon=1e-8)
    assert torch.allclose(ours, ref, atol=1e-12)
    qr = lr.orthogonalize(a, "qr")
    assert torch.allclose(ours.abs(), qr.abs(), atol=1e-10)


def test_zero_columns_never_become_nan() -> None:
    a = torch.zeros(20, 3, dtype=torch.float64)
    a[:, 0] = 1.0
    for method in ("qr", "gram_schmidt"):
        q = lr.orthogonalize(a, method)
        assert torch.isfinite(q).all(), method
    assert lr.orthogonalize(torch.zeros(6, 2), "gram_schmidt").eq(0).all()
    with pytest.raises(ValueError, match="orth_eps"):
        lr.orthogonalize(a, "gram_schmidt", eps=0.0)
