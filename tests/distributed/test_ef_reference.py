"""Static Top-k with error feedback follows an independent float64 simulation of EF-Top-k momentum SGD.

The reference never touches ds_gravac: per rank it computes the gradient on that rank's batch, adds the rank's
residual, keeps the ceil(n/θ) largest magnitudes of every tensor with at least ``min_compress_numel`` elements
(smaller tensors go dense, no residual), averages over ranks and applies torch.optim.SGD's momentum/weight-decay
rule. The first step is the dense discovery step (docs/design.md).
"""
from __future__ import annotations

import math

import pytest
import torch

import models as M
from harness import run_ranks

MIN_NUMEL, STEPS, LR, MOMENTUM, WD = 1000, 12, 0.05, 0.9, 1e-4


def _job(rank: int, world: int, width: int, cf: float, dense_steps: frozenset[int]) -> dict:
    import ds_gravac
    model = M.make_model(width=width)
    gravac = {"mode": "static", "compressor": "topk", "cf": cf, "min_compress_numel": MIN_NUMEL}
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, lr=LR))
    handle = ds_gravac.get_handle(engine)
    M.force_dense(handle, dense_steps.__contains__)
    M.train(engine, rank, STEPS)
    branches = [r["branch"] for r in handle.pop_stats()]
    params = M.params_of(engine)
    # one more backward (no step): the decoded gradients are p.grad itself, views of the buckets' decode buffers
    x, y = M.batch(rank, STEPS)
    engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
    outs = {bm.scratch.untyped_storage().data_ptr() for bm in handle.sync.memory.buckets.values()}
    aliased = sorted(n for n, p in engine.module.named_parameters()
                     if p.grad is not None and p.grad.untyped_storage().data_ptr() in outs)
    return {"params": params, "branches": branches, "aliased": aliased}


def _reference(world: int, width: int, cf: float, dense_steps: frozenset[int]) -> dict[str, torch.Tensor]:
    residual: dict[tuple[int, str], torch.Tensor] = {}

    def sent(step: int, rank: int, name: str, grad: torch.Tensor) -> torch.Tensor:
        if grad.numel() < MIN_NUMEL or step == 0:
            return grad
        acc = grad + residual.get((rank, name), torch.zeros_like(grad))
        if step in dense_steps:                     # dense send of g + r clears r
            residual[rank, name] = torch.zeros_like(grad)
            return acc
        keep = torch.zeros(acc.numel(), dtype=torch.bool)
        keep[acc.flatten().abs().topk(math.ceil(acc.numel() / cf)).indices] = True
        out = torch.where(keep.view_as(acc), acc, torch.zeros_like(acc))
        residual[rank, name] = acc - out
        return out

    return M.float64_momentum_sgd(width, STEPS, world, LR, MOMENTUM, WD, sent)


# width 64: every hidden tensor (4,096 values) takes the direct selection; width 300: the 90,000-value hidden
# tensors take Top-k's sampled-threshold path (auto, n >= 65,536), as ResNet101's large convolutions do. At 100x
# the decoded entries cover < 5% of the bucket, so each decode clears only the previous step's positions; dense
# steps in between (forced) send g + r and clear the memory, twice, so both EF buffers serve as the dense one.
CASES = {"direct_selection": (64, 10, ()), "sampled_threshold": (300, 10, ()),
         "sampled_100x_sparse_clear_dense_steps": (300, 100, (4, 7, 8))}


def _all_jobs(rank: int, world: int) -> dict:
    """Every case on one spawn of the ranks."""
    return {case: _job(rank, world, width, cf, frozenset(dense)) for case, (width, cf, dense) in CASES.items()}


@pytest.fixture(scope="module")
def all_trained() -> list:
    return run_ranks(_all_jobs, 2)


@pytest.fixture(params=list(CASES))
def trained(request: pytest.FixtureRequest, all_trained: list) -> tuple[int, float, frozenset[int], list]:
    width, cf, dense = CASES[request.param]
    return width, cf, frozenset(dense), [r[request.param] for r in all_trained]


def test_topk_error_feedback_matches_float64_reference(trained: tuple[int, float, frozenset[int], list]) -> None:
    width, cf, dense_steps, results = trained
    ref = _reference(2, width, cf, dense_steps)
    start = M.params_of_model(M.make_model(width=width))
    for res in results:
        want_branches = ["dense" if s == 0 or s in dense_steps else "cand" for s in range(STEPS)]
        assert res["branches"] == want_branches, res["branches"]
        for name, want in ref.items():
            got = res["params"][name].double()
            moved = (want - start[name].double()).norm()
            assert moved > 0
            err = (got - want).norm() / moved
            assert err < 1e-4, (name, float(err))


def test_compressed_gradients_are_decoded_straight_into_p_grad(trained: tuple[int, float, frozenset[int], list]
                                                               ) -> None:
    """Every tensor compressed at ≥ min_compress_numel gets p.grad as a view of its bucket's decode buffer
    (no separate write-back pass); the small ones travel in dense buckets and keep their own p.grad."""
    width, _, _, results = trained
    model = M.make_model(width=width)
    big = sorted(n for n, p in model.named_parameters() if p.numel() >= MIN_NUMEL and not n.startswith("unused"))
    assert big
    for res in results:
        assert res["aliased"] == big
