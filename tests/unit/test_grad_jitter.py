"""The runners' --grad-jitter control: its size and its agreement across ranks, from the normal law alone."""
from __future__ import annotations

import pytest
import torch

from runners.common import base_parser, finish_parser
from runners.grad_jitter import jitter_gradients_


def _params(seed: int = 1) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.zeros(300, 200)), torch.nn.Parameter(torch.zeros(7)),
          torch.nn.Parameter(torch.zeros(3, 3))]
    for p in ps[:2]:
        p.grad = torch.randn(p.shape, generator=g).add_(0.5)
    return ps                                   # the last one has no gradient


def test_relative_perturbation_is_unbiased_with_the_requested_spread() -> None:
    ps = _params()
    before = ps[0].grad.clone()
    jitter_gradients_(ps, 1e-3, seed=0, step=5)
    eps = (ps[0].grad.double() / before.double() - 1.0) / 1e-3
    # 60,000 draws of N(0, 1): the sample mean is within 4.5 / sqrt(n) = 0.018 of 0, the std within 2%
    assert abs(eps.mean().item()) < 0.02
    assert 0.98 < eps.std().item() < 1.02
    assert ps[2].grad is None


def test_same_seed_and_step_give_the_same_gradients_on_every_rank() -> None:
    """What keeps data-parallel replicas identical: the noise depends on (seed, step) only."""
    a, b, c, d = _params(), _params(), _params(), _params()
    jitter_gradients_(a, 1e-6, seed=3, step=7)
    jitter_gradients_(b, 1e-6, seed=3, step=7)
    jitter_gradients_(c, 1e-6, seed=3, step=8)
    jitter_gradients_(d, 1e-6, seed=4, step=7)
    for pa, pb, pc, pd, p0 in zip(a[:2], b[:2], c[:2], d[:2], _params()[:2]):
        assert torch.equal(pa.grad, pb.grad)
        assert not torch.equal(pa.grad, pc.grad) and not torch.equal(pa.grad, pd.grad)
        assert not torch.equal(pa.grad, p0.grad)
        assert torch.allclose(pa.grad, p0.grad, rtol=1e-5, atol=0)


def test_zero_leaves_the_gradients_bit_identical_and_bad_values_are_refused() -> None:
    ps, ref = _params(), _params()
    jitter_gradients_(ps, 0.0, seed=0, step=1)
    assert all(torch.equal(p.grad, r.grad) for p, r in zip(ps[:2], ref[:2]))
    with pytest.raises(ValueError, match=r"rel must be in \[0, 0.1\], got 0.5"):
        jitter_gradients_(ps, 0.5, seed=0, step=1)


@pytest.mark.parametrize("argv, message", [
    (["--grad-jitter=-1e-6"], "--grad-jitter must be in [0, 0.1], got -1e-06"),
    (["--grad-jitter", "1e-6", "--system", "ddp"], "--grad-jitter applies to --system deepspeed or gravac, not ddp"),
])
def test_runner_refuses_a_bad_jitter_before_training(argv: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    parser = base_parser("test")
    parser.add_argument("--model", default="tiny_cnn")
    with pytest.raises(SystemExit):
        finish_parser(parser, ["--deepspeed_config", "x.json"] + argv)
    assert message in capsys.readouterr().err
