"""ds_gravac's ``powersgd`` against PyTorch's own ``powerSGD_hook`` on one bucket (2 gloo ranks): the same initial
factor, rank and start step give the same averaged gradients at every step.

One bias-free linear layer is one matrix and one DDP bucket, so there is no uncompressed tensor (whose error
feedback differs on purpose: PyTorch feeds back local-minus-mean, ds_gravac sends such tensors exactly). PyTorch's
first factor comes from ``torch.manual_seed(RandomState(seed).randint(1e9))``; it is handed to ds_gravac through the
compressor's replicated state. Both runs are dense for two steps (PyTorch: ``start_powerSGD_iter=2``; ds_gravac:
the discovery step and ``warmup_steps: 1``, with ``dense_refresh`` off: PyTorch leaves its factors alone on
vanilla all-reduce steps), then compress with warm start and error feedback.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

N_OUT, N_IN, RANK, STEPS, LR, SEED = 48, 80, 4, 8, 0.05, 0


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(N_IN, N_OUT, bias=False)


def _data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, N_IN, generator=g), torch.randint(0, N_OUT, (8,), generator=g)


def _pytorch_first_factor() -> torch.Tensor:
    """The Q that powerSGD_hook draws at its first compressed step (before orthogonalizing it)."""
    rng = np.random.RandomState(SEED)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.randint(1_000_000_000))
        return torch.randn(1, N_IN, RANK)[0]


def _job(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ds_gravac
    ddp = DDP(_model())
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=RANK, start_powerSGD_iter=2,
                             use_error_feedback=True, warm_start=True, random_seed=SEED)
    ddp.register_comm_hook(state, ps.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    torch_grads = []
    for s in range(STEPS):
        x, y = _data(rank, s)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        torch_grads.append(ddp.module.weight.grad.detach().clone())
        opt.step()
    dist.barrier()

    gravac = {"mode": "static", "warmup_steps": 1,
              "compressor": {"type": "powersgd", "params": {"rank": RANK, "orthogonalize": "qr",
                                                                "dense_refresh": False}}}
    cfg = M.ds_config(gravac, micro=8, lr=LR)
    cfg["optimizer"]["params"] = {"lr": LR, "momentum": 0.0, "weight_decay": 0.0}
    model = _model()
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    handle = ds_gravac.get_handle(engine)
    first = _pytorch_first_factor().t().contiguous()          # ds_gravac stores factors transposed (rank × m)
    handle.compressor.load_state_dict({"replicated": {"factors": {"weight": {"q": first}}}})
    ours = []
    for s in range(STEPS):
        x, y = _data(rank, s)
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        ours.append(engine.module.weight.grad.detach().clone())
        engine.step()
    branches = [r["branch"] for r in handle.pop_stats()]
    return {"torch": torch_grads, "ours": ours, "branches": branches}


@pytest.fixture(scope="module")
def results() -> list:
    return run_ranks(_job, 2)


def test_same_averaged_gradients_as_pytorchs_powersgd_hook(results: list) -> None:
    for res in results:
        assert res["branches"] == ["dense", "dense"] + ["cand"] * (STEPS - 2)
        for step, (want, got) in enumerate(zip(res["torch"], res["ours"])):
            scale = float(want.abs().max())
            assert scale > 0
            err = float((got - want).abs().max()) / scale
            assert err < 1e-4, (step, err)
    # the compressed steps really are rank-4 approximations (not the dense average by accident)
    dense_like = [torch.linalg.matrix_rank(g.double(), rtol=1e-5).item() for g in results[0]["ours"][2:]]
    assert max(dense_like) <= RANK
