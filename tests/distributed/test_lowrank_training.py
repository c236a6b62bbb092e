"""PowerSGD and ACP-SGD on the real synchronizer (gloo ranks, >= 6 buckets): an independent float64 simulation of
each method, bitwise identical replicas, bytes per step as the formulas say (fp32, bf16, gradient accumulation 2),
and 3 ranks.

The reference never touches the synchronizer: per rank it computes the gradient of that rank's batch in float64,
runs the method's arithmetic (``ds_gravac.compress.lowrank_steps``, itself checked against the methods'
invariants in tests/unit/test_lowrank_steps.py) on every matrix that pays at the rank, averages the rest, and
applies torch.optim.SGD's momentum and weight decay. Step 0 is the dense discovery step, where the shared factor
the next step reads takes one power iteration on the exact average (``dense_refresh``).
"""
from __future__ import annotations

import math

import pytest
import torch

import models as M
from ds_gravac.compress import lowrank_steps as ls
from ds_gravac.compress.lowrank import matrix_shape, orthogonalize, seeded_factor
from harness import run_ranks
from lowrank_bytes import step_bytes

STEPS, LR, MOMENTUM, WD, RANK, RATE = 9, 0.05, 0.9, 1e-4, 2, 2.0
PLAIN_RANK = 12        # the 64x64 matrices pay (factors); the 64x32 input and 10x64 output matrices do not (plain)
MODEL = {"width": 64, "depth": 6}
CAP_MB = 0.01          # every 64x64 tensor gets a bucket of its own: >= 6 compressible buckets


def gravac(comp: str, lowrank: int = RANK, **extra: object) -> dict:
    return {"mode": "static", "compressor": {"type": comp, "params": {"rank": lowrank}}, "bucket_cap_mb": CAP_MB,
            **extra}


def _train(rank: int, comp: str, steps: int, gas: int = 1, bf16: bool = False, lowrank: int = RANK) -> dict:
    import ds_gravac
    model = M.make_model(seed=0, **MODEL)
    if bf16:
        model = model.to(torch.bfloat16)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac(comp, lowrank), gas=gas, bf16=bf16, lr=LR,
                                                         world=_world()))
    handle = ds_gravac.get_handle(engine)
    M.train(engine, rank, steps, gas=gas, dtype=torch.bfloat16 if bf16 else None)
    return {"params": M.params_of(engine), "records": handle.pop_stats(),
            "buckets": handle.sync.plan.num_buckets, "rounds": handle.sync.pattern.rounds,
            "compressible_buckets": sum(b.compressible for b in handle.sync.plan.buckets),
            "bucket_shapes": [[tuple(m.param.shape) for m in b.members] for b in handle.sync.plan.buckets
                              if b.compressible]}


def _world() -> int:
    import torch.distributed as dist
    return dist.get_world_size()


def _job(rank: int, world: int) -> dict:
    out = {}
    for comp in ("powersgd", "acpsgd"):
        out[comp] = _train(rank, comp, STEPS)
        if world == 2:
            out[f"{comp}-bf16-gas2"] = _train(rank, comp, 4, gas=2, bf16=True)
    return out


@pytest.fixture(scope="module")
def two_ranks() -> list:
    return run_ranks(_job, 2)


@pytest.fixture(scope="module")
def three_ranks() -> list:
    return run_ranks(_job, 3)


# ---- the float64 reference ------------------------------------------------------------------------------
def _kind(shape: tuple[int, ...], lowrank: int = RANK) -> str:
    """'factors', 'plain' (a matrix that does not pay at RANK) or 'dense' (1-D and tiny: the dense path)."""
    if len(shape) < 2:
        return "dense"
    n, m = matrix_shape(shape)
    if (n + m) * RATE >= n * m:
        return "dense"
    r = min(lowrank, n, m)
    return "factors" if (n + m) * r * RATE < n * m else "plain"


def _reference(comp: str, world: int, lowrank: int = RANK) -> dict[str, torch.Tensor]:
    model = M.make_model(seed=0, **MODEL).double()
    names = [n for n, _ in model.named_parameters() if not n.startswith("unused")]
    params = dict(model.named_parameters())
    shapes = {n: matrix_shape(params[n].shape) for n in names}
    kinds = {n: _kind(tuple(params[n].shape), lowrank) for n in names}
    error = {(w, n): torch.zeros(shapes[n], dtype=torch.float64) for w in range(world) for n in names}
    q_prev = {n: seeded_factor(0, f"{n}:q", shapes[n][1], lowrank, dtype=torch.float64) for n in names}
    p_prev = {n: seeded_factor(0, f"{n}:p", shapes[n][0], lowrank, dtype=torch.float64) for n in names}
    momentum: dict[str, torch.Tensor] = {}
    p_step = True
    for step in range(STEPS):
        grads = {}
        for w in range(world):
            model.zero_grad()
            x, y = M.batch(w, step)
            torch.nn.functional.cross_entropy(model(x.double()), y).backward()
            for n in names:
                grads[w, n] = params[n].grad.detach().clone().reshape(shapes[n])
        avg = {}
        for n in names:
            if step == 0 or kinds[n] != "factors":         # dense discovery step; plain and dense tensors
                avg[n] = sum(grads[w, n] + error[w, n] for w in range(world)) / world
                for w in range(world):
                    error[w, n] = torch.zeros_like(error[w, n])
                if kinds[n] == "factors":                  # a dense step: one power iteration on the average
                    ph = orthogonalize(avg[n] @ orthogonalize(q_prev[n]))
                    q_prev[n] = avg[n].t() @ ph
                continue
            xs = [grads[w, n] + error[w, n] for w in range(world)]
            if comp == "powersgd":
                _, pws = zip(*(ls.powersgd_round1([x], [q_prev[n]]) for x in xs))
                p_sum = sum(p[0] for p in pws)
                rounds = [ls.powersgd_round2([x], [p_sum]) for x in xs]
                q_sum = sum(q[0] for _, q in rounds)
                g, _, q = ls.powersgd_finish([xs[0]], rounds[0][0], [q_sum], world)
                avg[n], q_prev[n] = g[0], q[0]
                for w in range(world):
                    error[w, n] = xs[w] - avg[n]
            elif p_step:
                parts = [ls.acp_p_step([x], [q_prev[n]]) for x in xs]
                p_prev[n] = sum(p[1][0] for p in parts)
                avg[n] = ls.acp_decode_p([p_prev[n]], parts[0][0], world)[0]
                for w in range(world):
                    error[w, n] = parts[w][2][0]
            else:
                parts = [ls.acp_q_step([x], [p_prev[n]]) for x in xs]
                q_prev[n] = sum(p[1][0] for p in parts)
                avg[n] = ls.acp_decode_q(parts[0][0], [q_prev[n]], world)[0]
                for w in range(world):
                    error[w, n] = parts[w][2][0]
        if step > 0:
            p_step = not p_step
        with torch.no_grad():
            for n in names:
                d = avg[n].reshape(params[n].shape) + WD * params[n]
                momentum[n] = d.clone() if n not in momentum else MOMENTUM * momentum[n] + d
                params[n] -= LR * momentum[n]
    return {n: params[n].detach() for n in names}


def _assert_matches_reference(results: list, comp: str, lowrank: int = RANK, tol: float = 1e-4) -> None:
    world = len(results)
    ref = _reference(comp, world, lowrank)
    start = M.params_of_model(M.make_model(seed=0, **MODEL))
    for res in results:
        assert res[comp]["compressible_buckets"] >= 6
        for name, want in ref.items():
            got = res[comp]["params"][name].double()
            moved = (want - start[name].double()).norm()
            assert moved > 0
            assert (got - want).norm() / moved < tol, (comp, name)


@pytest.mark.parametrize("comp", ["powersgd", "acpsgd"])
def test_two_ranks_follow_the_float64_reference(two_ranks: list, comp: str) -> None:
    _assert_matches_reference(two_ranks, comp)


@pytest.mark.parametrize("comp", ["powersgd", "acpsgd"])
def test_three_ranks_follow_the_float64_reference(three_ranks: list, comp: str) -> None:
    _assert_matches_reference(three_ranks, comp)


def _plain_job(rank: int, world: int) -> dict:
    return {comp: _train(rank, comp, STEPS, lowrank=PLAIN_RANK) for comp in ("powersgd", "acpsgd")}


@pytest.mark.parametrize("comp", ["powersgd", "acpsgd"])
def test_buckets_whose_matrices_all_travel_plain_deliver_their_average(comp: str) -> None:
    """At a rank where some matrices do not pay, they travel plain; a bucket holding only such matrices has no
    second PowerSGD round, and its average must still reach the gradients (it once was never decoded)."""
    results = run_ranks(_plain_job, 2)
    shapes = results[0][comp]["bucket_shapes"]
    kinds = [{_kind(s, PLAIN_RANK) for s in bucket} for bucket in shapes]
    assert {"plain"} in kinds and any("factors" in k for k in kinds), shapes
    _assert_matches_reference(results, comp, PLAIN_RANK, tol=1e-3)    # rank 12: more fp32 rounding than rank 2


# ---- replicas and bytes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("run", ["powersgd", "acpsgd", "powersgd-bf16-gas2", "acpsgd-bf16-gas2"])
def test_replicas_bitwise_identical_and_bytes_as_the_formulas_say(two_ranks: list, run: str) -> None:
    comp = run.split("-")[0]
    a, b = two_ranks[0][run], two_ranks[1][run]
    for key in a["params"]:
        assert torch.equal(a["params"][key], b["params"][key]), key
    comm_bytes = 2 if "bf16" in run else 4
    records = a["records"]
    assert records[0]["branch"] == "dense" and all(r["branch"] == "cand" for r in records[1:])
    for i, rec in enumerate(records[1:]):
        want = step_bytes(M.make_model(seed=0, **MODEL), comp, lambda *_: RANK, p_step=i % 2 == 0,
                          comm_bytes=comm_bytes)
        assert rec["bytes_sent"] == pytest.approx(want, abs=0.5), (run, rec["step"])
    assert a["compressible_buckets"] >= 6
    assert a["rounds"] == (2 if comp == "powersgd" else 1), "ACP-SGD: one all-reduce per bucket per step"


def test_three_ranks_replicas_bitwise_identical(three_ranks: list) -> None:
    for comp in ("powersgd", "acpsgd"):
        for res in three_ranks[1:]:
            for key, value in three_ranks[0][comp]["params"].items():
                assert torch.equal(value, res[comp]["params"][key]), (comp, key)
        assert math.isfinite(three_ranks[0][comp]["records"][-1]["cf"])
