"""A NaN/Inf gradient on one rank: the ranks agree on it in the same step, the gradients go out exactly as plain
DeepSpeed would average them, and no ds_gravac state changes or ever holds a non-finite value.

Acceptance: 2 ranks, static Top-k 10x and GraVAC (and PowerSGD / ACP-SGD at rank 2, whose shared factors and
ACP's parity must not move either), one tensor > 131,072 elements (compressed) and small ones
(dense-classified); rank 1's gradient gets an Inf in the big tensor (and, separately, a NaN in a small one) at
step 5; the training loop notices the non-finite gradient and skips that optimizer step (as a user's loop or loss
scaler would). After 30 optimizer steps the parameters are bitwise equal to those of a loop that skipped step 5's
batch without any non-finite value; every memory slot and controller record stays finite throughout.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

STEPS, BAD_BATCH, MIN_NUMEL = 30, 5, 1000
STATIC = {"mode": "static", "compressor": "topk", "cf": 10, "min_compress_numel": MIN_NUMEL,
          "bucket_cap_mb": 0.3}
LOWRANK = {comp: {"mode": "static", "compressor": {"type": comp, "params": {"rank": 2}},
                  "min_compress_numel": MIN_NUMEL, "bucket_cap_mb": 0.3} for comp in ("powersgd", "acpsgd")}
GRAVAC = {"mode": "gravac", "compressor": "topk", "theta_min": 4, "theta_max": 100, "epsilon": 0.3,
          "omega": 0.0, "window": 10, "refresh_steps": 3, "min_sent_steps": 3, "min_compress_numel": MIN_NUMEL,
          "bucket_cap_mb": 0.3}


class WideNet(nn.Module):
    """``wide.weight`` has 262,144 elements (> 131,072); the biases and the small layers are dense-classified."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 512)
        self.wide = nn.Linear(512, 512)
        self.out = nn.Linear(512, 10)
        self.tiny = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tiny(self.out(torch.relu(self.wide(torch.relu(self.inp(x))))))


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _finite_state(handle) -> bool:
    """Every tensor of the rank's ds_gravac state (residuals, DGC memory, ...) and every controller record."""
    state = handle.state_dict()
    owned = _tensors(state["local"]) + _tensors(state["replicated"].get("compressor", {}))   # + low-rank factors
    tensors_ok = all(bool(torch.isfinite(t).all()) for t in owned if t.is_floating_point())
    ctrl = state["replicated"]["controller"]
    rows = [v for key in ("gains", "thru") for row in ctrl.get(key, []) for v in row]
    return tensors_ok and all(math.isfinite(float(v)) for v in rows)


def _job(rank: int, world: int, gravac: dict, poison: str, skip_batch_only: bool) -> dict:
    import ds_gravac
    torch.manual_seed(0)
    model = WideNet()
    target = model.wide.weight if poison == "inf" else model.tiny.bias
    raw: dict[str, torch.Tensor] = {}
    batch = {"i": 0}

    def inject(grad: torch.Tensor) -> torch.Tensor:
        if rank == 1 and batch["i"] == BAD_BATCH and not skip_batch_only:
            grad = grad.clone()
            grad.view(-1)[3] = float("inf") if poison == "inf" else float("nan")
        return grad

    target.register_hook(inject)
    for name, p in model.named_parameters():   # registered before ds_gravac's hooks: sees the raw gradient
        p.register_post_accumulate_grad_hook(lambda t, name=name: raw.__setitem__(name, t.grad.detach().clone()))
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, micro=16, lr=0.05))
    handle = ds_gravac.get_handle(engine)
    skipped, always_finite, grads_at_bad = [], True, None
    while engine.global_steps < STEPS:
        i = batch["i"]
        if skip_batch_only and i == BAD_BATCH:
            batch["i"] += 1
            continue
        x, y = M.batch(rank, i, micro=16)
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        if not all(bool(torch.isfinite(p.grad).all()) for p in engine.module.parameters()):
            skipped.append(i)
            grads_at_bad = ({n: p.grad.detach().clone() for n, p in engine.module.named_parameters()},
                            {n: t.clone() for n, t in raw.items()})
            engine.zero_grad()                     # the loop skips this optimizer step
        else:
            engine.step()
        always_finite = always_finite and _finite_state(handle)
        batch["i"] += 1
    records = handle.pop_stats()
    raw_all = None
    if grads_at_bad is not None:                   # every rank's raw gradients, to rebuild DeepSpeed's average
        import torch.distributed as dist
        raw_all = [None] * world
        dist.all_gather_object(raw_all, grads_at_bad[1])
    return {"params": M.params_of(engine), "skipped": skipped, "finite": always_finite,
            "grads_at_bad": None if grads_at_bad is None else grads_at_bad[0], "raw_all": raw_all,
            "branches": [(r["step"], r["branch"], r["nonfinite"]) for r in records]}


CASES = [("static", "inf"), ("static", "nan"), ("gravac", "inf"), ("gravac", "nan"), ("powersgd", "inf"),
         ("acpsgd", "inf")]


@pytest.fixture(scope="module")
def all_runs() -> list[dict]:
    """One spawn of the ranks for every case (fresh engines per loop; the spawn is the costly part)."""
    return run_ranks(_cases_job, 2)


@pytest.fixture(params=CASES, ids=lambda p: f"{p[0]}-{p[1]}")
def runs(request: pytest.FixtureRequest, all_runs: list[dict]) -> tuple[list, list]:
    both = [ranks[request.param] for ranks in all_runs]
    return [r[0] for r in both], [r[1] for r in both]


def _cases_job(rank: int, world: int) -> dict:
    """Per case, the poisoned loop, then the loop that skips the batch, one after the other on the same ranks."""
    out = {}
    for mode, poison in CASES:
        gravac = {"static": STATIC, "gravac": GRAVAC}.get(mode) or LOWRANK[mode]
        out[(mode, poison)] = (_job(rank, world, gravac, poison, False), _job(rank, world, gravac, poison, True))
    return out


def test_parameters_equal_a_loop_that_skipped_the_batch(runs: tuple[list, list]) -> None:
    poisoned, clean = runs
    for rank in range(2):
        assert poisoned[rank]["skipped"] == [BAD_BATCH], "every rank must see the non-finite gradient"
        assert clean[rank]["skipped"] == []
        for name, want in clean[rank]["params"].items():
            assert torch.equal(poisoned[rank]["params"][name], want), name
    assert any(branch != "dense" for _, branch, _ in poisoned[0]["branches"]), "the run must compress"


def test_no_state_is_ever_non_finite(runs: tuple[list, list]) -> None:
    for res in runs[0]:
        assert res["finite"]
        bad = [r for r in res["branches"] if r[2] > 0]
        assert [r[1] for r in bad] == ["dense"], bad


def test_optimizer_sees_deepspeeds_average_on_the_non_finite_step(runs: tuple[list, list]) -> None:
    """p.grad on that step equals DeepSpeed's averaging of the raw gradients, (g0 + g1) * (1/2), bit for bit."""
    for res in runs[0]:
        raw0, raw1 = res["raw_all"]
        for name, got in res["grads_at_bad"].items():
            want = (raw0[name] + raw1[name]).mul_(0.5)
            assert torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(want, nan=7.0)), name


def _raise_job(rank: int, world: int) -> str:
    import ds_gravac
    torch.manual_seed(0)
    model = WideNet()
    state = {"step": 0}
    model.wide.weight.register_hook(lambda g: g.clone().fill_(float("nan")) if rank == 1 and state["step"] == 2
                                    else g)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config({**STATIC, "nonfinite": "raise"}, micro=16))
    for s in range(4):
        state["step"] = s
        x, y = M.batch(rank, s, micro=16)
        try:
            engine.backward(nn.functional.cross_entropy(engine(x), y))
        except ds_gravac.GravacError as exc:
            return str(exc)
        engine.step()
    return "no error"


def test_raise_names_the_step_and_the_tensor_on_every_rank() -> None:
    for message in run_ranks(_raise_job, 2):
        assert message.startswith("ds_gravac: non-finite gradient (NaN/Inf) at step 2")
        assert "rank 1: 'wide.weight'" in message and "rank 0" not in message
