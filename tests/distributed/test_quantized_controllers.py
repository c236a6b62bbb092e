"""Quantizers under the controllers, on real gloo ranks and DeepSpeed engines: GraVAC over a quantizer's grid of
CFs (terngrad, qsgd; pipelined and strict decisions), Accordion between two grid CFs, and EF-signSGD's
update-space exchange (learning rates that change every step, two param groups, bf16, and its constant-γ
equivalence with onebit). Everything travels over the parameter-server exchange (all-to-all, owner merge,
all-gather), and EF-signSGD also over the plain all-gather.

Expected values are derived here from the algorithms' definitions, never read back from the code under test:
gains from a float64 re-implementation of deterministic TernGrad, bytes from the bucket sizes, conservation from
the update-space error-feedback law. One spawn per world size (2, 3, 4 ranks) runs every job of that size.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

TERNGRAD_GRID = (4.0, 8.0, 16.0, 32.0)
QSGD_GRID = (4.0, 8.0, 16.0)
BASE = {"bucket_cap_mb": 0.02, "min_compress_numel": 0, "agreement_check_interval": 1}
# omega 0: no escalation and no settling, so the search walks the whole grid, one CF per 2-step window
SEARCH = {**BASE, "mode": "gravac", "window": 2, "refresh_steps": 1, "min_sent_steps": 1, "omega": 0.0}
DETERMINISTIC_TERNGRAD = {"type": "terngrad", "params": {"stochastic": False}}
PLAIN_SGD = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.0, "weight_decay": 0.0}}
GAMMA = 2.0 ** -4        # a power of two: γ·x and x/γ are exact in floating point


# ---- helpers run inside the ranks ----------------------------------------------------------------------------
def _engine(gravac: dict, world: int, groups: bool = False, **kw: Any) -> Any:
    import ds_gravac
    model = M.make_model(seed=0)
    params: Any = model.parameters()
    if groups:      # two param groups, so EF-signSGD's partitions mix learning rates
        first = [p for n, p in model.named_parameters() if n.startswith(("inp.", "hidden.0.", "hidden.1."))]
        rest = [p for n, p in model.named_parameters() if not n.startswith(("inp.", "hidden.0.", "hidden.1."))]
        params = [{"params": first}, {"params": rest, "lr": 0.02}]
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=params,
                                      config=M.ds_config(gravac, world=world, **kw))
    return engine


def _layout(engine: Any) -> dict[int, list[tuple[str, int, int]]]:
    """Every compressible bucket's members as (name, offset, numel), by bucket index."""
    plan = engine._ds_gravac_handle.sync.plan
    return {b.index: [(m.name, m.offset, m.numel) for m in b.members] for b in plan.buckets if b.compressible}


def _dense_numels(engine: Any) -> list[int]:
    return [b.numel for b in engine._ds_gravac_handle.sync.plan.buckets if not b.compressible]


def _raw_grad_hooks(engine: Any, store: dict) -> None:
    """Keep each parameter's local (pre-exchange) gradient of the current micro-batch."""
    for name, p in engine.module.named_parameters():
        p.register_hook(lambda g, name=name: store.__setitem__(name, g.detach().double().clone()))


def _records(engine: Any) -> list[dict]:
    keep = ("step", "branch", "cf_sent", "bytes_sent", "gravac/theta_min", "gravac/theta_c")
    return [{k: v for k, v in r.items() if k in keep or k.startswith("gain_raw@")}
            for r in engine._ds_gravac_handle.pop_stats()]


def _controller_run(rank: int, world: int, gravac: dict, steps: int) -> dict:
    """Train; keep the raw gradients of step 1 (the first step of the frozen bucket plan; TernGrad without error
    feedback keeps no residual, so x = g) for the gain reference."""
    engine = _engine(gravac, world)
    raw: dict = {}
    _raw_grad_hooks(engine, raw)
    M.train(engine, rank, 2)
    step1 = dict(raw)
    M.train(engine, rank, steps - 2, start=2)
    handle = engine._ds_gravac_handle
    return {"params": M.params_of(engine), "records": _records(engine), "raw1": step1, "layout": _layout(engine),
            "dense": _dense_numels(engine), "state": handle.controller.state_dict(),
            "events": handle.pop_events()}


def _efsignsgd_run(rank: int, world: int, steps: int, exchange: str = "ps") -> dict:
    """EF-signSGD with two param groups whose learning rates change every step, set by hand before backward."""
    engine = _engine({**BASE, "mode": "static", "compressor": "efsignsgd", "quantized_exchange": exchange}, world,
                     groups=True, optimizer=PLAIN_SGD)
    groups = engine.optimizer.param_groups
    owner = {id(p): gi for gi, g in enumerate(groups) for p in g["params"]}
    raw: dict = {}
    _raw_grad_hooks(engine, raw)
    start = M.params_of(engine)
    lrs, raws, branches = [], [], []
    for s in range(steps):
        rates = (0.05 * (1.0 + 0.3 * s), 0.02 * (1.0 + 0.5 * (s % 3)))
        for g, lr in zip(groups, rates):
            g["lr"] = lr
        x, y = M.batch(rank, s)
        engine.backward(nn.functional.cross_entropy(engine(x), y))
        engine.step()
        lrs.append({n: rates[owner[id(p)]] for n, p in engine.module.named_parameters()})
        raws.append(dict(raw))
        branches.append(engine._ds_gravac_handle.last_stats()["branch"])
    sync = engine._ds_gravac_handle.sync
    return {"start": start, "end": M.params_of(engine), "lrs": lrs, "raws": raws, "branches": branches,
            "memory": {b: bm.slots["e"].clone() for b, bm in sync.memory.buckets.items()},
            "server": {b: s.clone() for b, s in sync.server.slots.items()}, "layout": _layout(engine)}


def _equivalence_run(rank: int, world: int, steps: int) -> dict:
    """EF-signSGD and onebit (mean_abs, error feedback) side by side at the same constant learning rate γ."""
    out = {}
    for name in ("efsignsgd", "onebit"):
        engine = _engine({**BASE, "mode": "static", "compressor": name}, world,
                         optimizer={"type": "SGD", "params": {"lr": GAMMA, "momentum": 0.0, "weight_decay": 0.0}})
        grads = []
        for s in range(steps):
            x, y = M.batch(rank, s)
            engine.backward(nn.functional.cross_entropy(engine(x), y))
            grads.append({n: p.grad.detach().clone() for n, p in engine.module.named_parameters()})
            engine.step()
        sync = engine._ds_gravac_handle.sync
        slot = "e" if name == "efsignsgd" else "residual"
        out[name] = {"params": M.params_of(engine), "grads": grads,
                     "memory": {b: bm.slots[slot].clone() for b, bm in sync.memory.buckets.items()},
                     "server": {b: s.clone() for b, s in sync.server.slots.items()}}
    return out


def _bf16_run(rank: int, world: int, steps: int) -> dict:
    """EF-signSGD under bf16: DeepSpeed's bf16 optimizer keeps fp32 master copies in the optimizer's groups, so each
    parameter's learning rate must be found through the wrapper."""
    engine = _engine({**BASE, "mode": "static", "compressor": "efsignsgd"}, world, groups=True, bf16=True,
                     optimizer=PLAIN_SGD)
    M.train(engine, rank, steps, dtype=torch.bfloat16)
    return {"params": M.params_of(engine), "branch": engine._ds_gravac_handle.last_stats()["branch"]}


def _job_two(rank: int, world: int) -> dict:
    accordion = {**BASE, "mode": "accordion", "compressor": "terngrad",
                 "accordion": {"interval_steps": 2, "eta": 100.0, "low_compression": 4, "high_compression": 32}}
    return {
        "terngrad": _controller_run(rank, world, {**SEARCH, "compressor": DETERMINISTIC_TERNGRAD}, 8),
        "qsgd": _controller_run(rank, world, {**SEARCH, "compressor": "qsgd"}, 6),
        "strict": _controller_run(rank, world, {**SEARCH, "compressor": "terngrad", "decision": "strict"}, 6),
        "accordion": _controller_run(rank, world, accordion, 6),
        "efsignsgd": _efsignsgd_run(rank, world, 5),
        "efsignsgd/allgather": _efsignsgd_run(rank, world, 4, exchange="allgather"),
        "equivalence": _equivalence_run(rank, world, 4),
        "bf16": _bf16_run(rank, world, 3),
    }


def _job_more(rank: int, world: int) -> dict:
    return {"terngrad": _controller_run(rank, world, {**SEARCH, "compressor": "terngrad"}, 4),
            "efsignsgd": _efsignsgd_run(rank, world, 3)}


@pytest.fixture(scope="module")
def runs() -> dict[int, list]:
    """Results per world size, each group spawned once, on first use by a test of that size."""
    return {}


def results_for(runs: dict[int, list], world: int) -> list:
    if world not in runs:
        runs[world] = run_ranks(_job_two if world == 2 else _job_more, world, timeout=300)
    return runs[world]


# ---- float64 references -----------------------------------------------------------------------------------------
def _flat(values: dict[str, torch.Tensor], bucket: list[tuple[str, int, int]]) -> torch.Tensor:
    """A bucket's flat values; a parameter that never got a gradient (``unused``) counts as zeros."""
    return torch.cat([values[name].double().reshape(-1) if name in values
                      else torch.zeros(numel, dtype=torch.float64) for name, _, numel in bucket])


def _partitions(x: torch.Tensor, world: int) -> tuple[torch.Tensor, list[int]]:
    """``[N, L]`` zero-padded partitions, as the exchange cuts a bucket, and each partition's real length."""
    size = math.ceil(x.numel() / world)
    real = [max(0, min(size, x.numel() - j * size)) for j in range(world)]
    return torch.cat([x, x.new_zeros(world * size - x.numel())]).view(world, size), real


def _terngrad_nearest(part: torch.Tensor, bits: int) -> torch.Tensor:
    """TernGrad with round-to-nearest: ``lo + round((x − lo)/gap)·gap`` between the partition's min and max."""
    lo, hi = float(part.min()), float(part.max())
    top = 2 ** bits - 1
    gap = (hi - lo) / top
    if gap == 0:
        return torch.full_like(part, lo)
    return lo + torch.floor((part - lo) / gap + 0.5).clamp(0, top) * gap


def _step_bytes(layout: dict, dense: list[int], world: int, bits_of: Any) -> float:
    """Data bytes one rank sends in a step where compressible bucket b is TernGrad at ``bits_of(b)`` bits over
    the parameter server: ``2(N−1)`` partition payloads of ``2 + ceil(L·bits/32)`` words, plus ring all-reduces."""
    total = 0.0
    for b, bucket in layout.items():
        size = math.ceil(sum(numel for _, _, numel in bucket) / world)
        total += 2 * (world - 1) * 4 * (2 + math.ceil(size * bits_of(b) / 32))
    return total + sum(2.0 * (world - 1) / world * 4 * n for n in dense)


# ---- GraVAC over a quantizer's grid ------------------------------------------------------------------------------
@pytest.mark.parametrize("world, case, grid", [(2, "terngrad", TERNGRAD_GRID), (2, "qsgd", QSGD_GRID),
                                               (2, "strict", TERNGRAD_GRID), (3, "terngrad", TERNGRAD_GRID),
                                               (4, "terngrad", TERNGRAD_GRID)])
def test_gravac_sends_grid_levels_and_replicas_agree(runs: dict, world: int, case: str, grid: tuple) -> None:
    results = results_for(runs, world)
    ref = results[0][case]
    for other in results[1:]:
        for key, value in ref["params"].items():
            assert torch.isfinite(value).all(), key
            assert torch.equal(value, other[case]["params"][key]), key
        assert other[case]["state"] == ref["state"], "the controller state must be replicated"
        assert other[case]["records"] == ref["records"], "levels, branches, pooled gains and sizes agree"
    recs = ref["records"]
    assert recs[0]["branch"] == "dense"
    sent = [r["cf_sent"] for r in recs[1:] if r["branch"] != "dense"]
    assert sent and set(sent) <= set(grid), sent
    assert len(set(sent)) >= 2, f"the search must move over the grid: {sent}"
    for r in recs:
        assert r["gravac/theta_min"] in grid and r["gravac/theta_c"] in grid, r
    assert ref["state"]["theta_min"] == grid[0], "unset theta_min spans the whole grid"


def test_gravac_walks_the_whole_terngrad_grid(runs: dict) -> None:
    recs = results_for(runs, 2)[0]["terngrad"]["records"]
    assert [r["gravac/theta_c"] for r in recs] == [8.0, 8.0, 8.0, 16.0, 16.0, 32.0, 32.0, 32.0]
    assert [r["cf_sent"] for r in recs[1:]] == [8.0, 8.0, 16.0, 16.0, 32.0, 32.0, 32.0]


def test_gravac_gain_is_the_decoded_payloads_share_of_the_input(runs: dict) -> None:
    """Step 1 (x = g: deterministic TernGrad without error feedback) measures θ_min = 4 and θ_c = 8 on every
    partition directly; the numerator is ‖D(C_θ(x))‖² over the bucket's real elements, pooled over ranks."""
    world = 2
    results = results_for(runs, world)
    layout, dense = results[0]["terngrad"]["layout"], results[0]["terngrad"]["dense"]
    assert not dense, "every bucket of the test model is compressible"
    for theta, bits in ((4.0, 8), (8.0, 4)):
        num = den = 0.0
        for r in results:
            raw = r["terngrad"]["raw1"]
            for bucket in layout.values():
                x = _flat(raw, bucket)
                parts, real = _partitions(x, world)
                for part, c in zip(parts, real):
                    num += float(_terngrad_nearest(part, bits)[:c].square().sum())
                den += float(x.square().sum())
        got = results[0]["terngrad"]["records"][1][f"gain_raw@{theta:g}"]
        assert got == pytest.approx(num / den, rel=1e-4), theta


def test_strict_decisions_work_with_a_quantizer(runs: dict) -> None:
    recs = results_for(runs, 2)[0]["strict"]["records"]
    assert all(r["branch"] != "dense" for r in recs[1:]), "strict mode decides with the step's own gains"


# ---- Accordion between two grid levels -----------------------------------------------------------------------------
def test_accordion_switches_between_two_grid_levels(runs: dict) -> None:
    """Decision points every 2 steps; steps 0–3 are low compression (CF 4: 8 bits; no two windows to compare
    yet), from step 4 on η = 100 makes every layer high (CF 32: 1 bit) — except ``unused``, whose gradient norm
    is 0 and so always critical. A partition spans several layers, so a bucket holding a low layer stays low
    whole: the bytes sent follow exactly that rule."""
    world = 2
    results = results_for(runs, world)
    for other in results[1:]:
        for key, value in results[0]["accordion"]["params"].items():
            assert torch.equal(value, other["accordion"]["params"][key]), key
    acc = results[0]["accordion"]
    got = [r["bytes_sent"] for r in acc["records"]]
    mixed = {b for b, bucket in acc["layout"].items() if any(n.startswith("unused.") for n, _, _ in bucket)}
    assert mixed and len(mixed) < len(acc["layout"])
    low = _step_bytes(acc["layout"], acc["dense"], world, lambda b: 8)
    high = _step_bytes(acc["layout"], acc["dense"], world, lambda b: 8 if b in mixed else 1)
    assert got[1:] == [low, low, low, high, high], (got, low, high)


# ---- EF-signSGD ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world, case", [(2, "efsignsgd"), (3, "efsignsgd"), (4, "efsignsgd"),
                                         (2, "efsignsgd/allgather")])
def test_efsignsgd_update_space_conservation_with_changing_learning_rates(runs: dict, world: int, case: str) -> None:
    """``Σ_t applied update + (1/N)·Σ_w e_w + s = Σ_t γ_t·mean_w g_w(t)`` per element, with γ_t the learning rate
    of each tensor's group at step t (two groups, both changing every step), and replicas identical. The
    all-gather exchange has no server stage (s = 0)."""
    results = results_for(runs, world)
    ref = results[0][case]
    assert ref["branches"][0] == "dense" and set(ref["branches"][1:]) == {"cand"}
    for other in results[1:]:
        for key, value in ref["end"].items():
            assert torch.equal(value, other[case]["end"][key]), key
    server_seen = False
    for b, bucket in ref["layout"].items():
        n = sum(numel for _, _, numel in bucket)
        applied = _flat(ref["start"], bucket) - _flat(ref["end"], bucket)
        sent = sum(_flat({k: v * lrs[k] for k, v in raws.items()}, bucket)
                   for r in results for lrs, raws in zip(r[case]["lrs"], r[case]["raws"])) / world
        memory = sum(r[case]["memory"][b].double() for r in results) / world
        server = torch.cat([r[case]["server"][b].double() for r in results])[:n] if ref["server"] else 0 * memory
        server_seen |= bool(server.abs().sum() > 0)
        lhs = applied + memory + server
        tol = 1e-6 * float(sent.abs().max()) + 1e-7
        assert torch.allclose(lhs, sent, rtol=0, atol=tol), float((lhs - sent).abs().max())
    assert server_seen == (case == "efsignsgd"), "server residuals exist exactly under the parameter server"


def test_efsignsgd_with_constant_lr_is_onebit_scaled_by_lr(runs: dict) -> None:
    """With a constant γ, EF-signSGD's input is ``γ·(g + r)`` whenever its memory is ``γ·r``; mean-abs signs
    commute with the positive factor γ, and so does the owner's re-encoding — so it writes onebit's gradient
    (its update divided by γ) and keeps γ times onebit's residuals. γ is a power of two: bitwise."""
    for r in results_for(runs, 2):
        eq = r["equivalence"]
        ef, ob = eq["efsignsgd"], eq["onebit"]
        for s, (g_ef, g_ob) in enumerate(zip(ef["grads"], ob["grads"])):
            for key in g_ob:
                assert torch.equal(g_ef[key], g_ob[key]), (s, key)
        for key, value in ob["params"].items():
            assert torch.equal(ef["params"][key], value), key
        for b, mem in ob["memory"].items():
            assert torch.equal(ef["memory"][b], GAMMA * mem), b
            assert torch.equal(ef["server"][b], GAMMA * ob["server"][b]), b
        assert any(bool(m.any()) for m in ob["server"].values())


def test_efsignsgd_finds_learning_rates_through_the_bf16_optimizer(runs: dict) -> None:
    results = results_for(runs, 2)
    assert results[0]["bf16"]["branch"] == "cand"
    for key, value in results[0]["bf16"]["params"].items():
        assert torch.isfinite(value).all(), key
        assert torch.equal(value, results[1]["bf16"]["params"][key]), key
