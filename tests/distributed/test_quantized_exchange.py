"""Quantizers end to end on real gloo ranks and DeepSpeed engines: the parameter-server exchange (all-to-all,
owner merge and re-encode, all-gather) and the all-gather alternative.

Checked (static mode): replicas stay bitwise identical for every quantizer at 2 and 3 ranks; the decoded aggregate
equals a float64 reference (signSGD's majority vote, onebit's per-partition scale); the error-feedback conservation
law with worker and server residuals over real steps; server residuals survive a checkpoint exactly; a non-finite
step leaves every residual untouched. One spawn per world size (2 and 3) runs every job, which keeps the file fast.
Quantizers under GraVAC and Accordion, and EF-signSGD's update space: test_quantized_controllers.py; the
combinations refused at attach: tests/unit/test_quantized_levels.py.
"""
from __future__ import annotations

import math
import tempfile
from typing import Any

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

WIRED = ("onebit", "signsgd", "efsignsgd", "terngrad", "ternary", "qsgd", "tbq", "fp16", "bf16")
BASE = {"mode": "static", "bucket_cap_mb": 0.02, "min_compress_numel": 0}


def _engine(gravac: dict, world: int, **kw: Any) -> Any:
    import ds_gravac
    model = M.make_model(seed=0)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, world=world, **kw))
    return engine


def _layout(engine: Any) -> list[list[tuple[str, int, int]]]:
    """Every compressible bucket's members as (name, offset, numel), in plan order."""
    plan = engine._ds_gravac_handle.sync.plan
    return [[(m.name, m.offset, m.numel) for m in b.members] for b in plan.buckets if b.compressible]


def _residuals(engine: Any) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """This rank's worker residuals (per bucket element; TBQ's own memory) and server residuals (per owned
    partition)."""
    sync = engine._ds_gravac_handle.sync
    worker = {b: bm.slots[bm.input_slot].clone() for b, bm in sync.memory.buckets.items()}
    return worker, {b: s.clone() for b, s in sync.server.slots.items()}


def _raw_grad_hooks(engine: Any, store: dict) -> None:
    """Keep each parameter's local (pre-exchange) gradient of the current micro-batch."""
    for name, p in engine.module.named_parameters():
        p.register_hook(lambda g, name=name: store.__setitem__(name, g.detach().double().clone()))


def _step(engine: Any, rank: int, s: int, same_data: bool = False, poison: bool = False) -> dict[str, torch.Tensor]:
    """One step by hand: the averaged gradients the optimizer sees are returned (before ``step``)."""
    x, y = M.batch(0 if same_data else rank, s)
    if poison:
        x = x.clone()
        x[0, 0] = float("nan")
    engine.backward(nn.functional.cross_entropy(engine(x), y))
    grads = {n: p.grad.detach().double().clone() for n, p in engine.module.named_parameters() if p.grad is not None}
    engine.step()
    return grads


def _training(rank: int, world: int) -> dict:
    out: dict = {}
    for name in WIRED:
        engine = _engine({**BASE, "compressor": name}, world)
        M.train(engine, rank, 5)
        st = engine._ds_gravac_handle.last_stats()
        out[name] = {"params": M.params_of(engine), "branch": st["branch"], "bytes": st["bytes_sent"],
                     "dense": st["dense_bytes"], "cf": st["cf_sent"],
                     "pattern": engine._ds_gravac_handle.sync.pattern.__name__}
    engine = _engine({**BASE, "compressor": {"type": "tbq", "params": {"tau": 0.002}}}, world)
    M.train(engine, rank, 5)                      # a threshold the gradients reach: codes other than "stay"
    out["tbq/moving"] = {"params": M.params_of(engine), "branch": engine._ds_gravac_handle.last_stats()["branch"]}
    engine = _engine({**BASE, "compressor": "onebit", "quantized_exchange": "allgather"}, world)
    M.train(engine, rank, 5)
    out["onebit/allgather"] = {"params": M.params_of(engine), "branch": engine._ds_gravac_handle.last_stats()["branch"]}
    return out


def _aggregates(rank: int, world: int) -> dict:
    """One compressed step per exchange: signSGD on each rank's own data, onebit on identical data (then the
    owner's re-encoding of ``±s`` is exact, so both exchanges must decode the same thing)."""
    out: dict = {}
    for name, exchange, same in (("signsgd", "ps", False), ("signsgd", "allgather", False),
                                 ("onebit", "ps", True), ("onebit", "allgather", True), ("fp16", "auto", False)):
        engine = _engine({**BASE, "compressor": name, "quantized_exchange": exchange}, world)
        raw: dict = {}
        _raw_grad_hooks(engine, raw)
        _step(engine, rank, 0, same)                     # discovery step (dense)
        got = _step(engine, rank, 1, same)
        out[f"{name}/{exchange}"] = {"raw": dict(raw), "got": got, "layout": _layout(engine)}
    return out


CONSERVING = {"onebit": "onebit", "tbq": {"type": "tbq", "params": {"tau": 0.002}},
              "terngrad": {"type": "terngrad", "params": {"error_feedback": True}}}


def _conservation(rank: int, world: int) -> dict:
    out = {}
    for name, compressor in CONSERVING.items():
        engine = _engine({**BASE, "compressor": compressor}, world)
        raw: dict = {}
        _raw_grad_hooks(engine, raw)
        raws, aggs = [], []
        for s in range(5):
            aggs.append(_step(engine, rank, s))
            raws.append(dict(raw))
        worker, server = _residuals(engine)
        out[name] = {"raws": raws, "aggs": aggs, "worker": worker, "server": server, "layout": _layout(engine)}
    return out


def _checkpoint(rank: int, world: int, save_dir: str) -> dict:
    import ds_gravac
    gravac = {**BASE, "compressor": "onebit"}
    straight = _engine(gravac, world)
    M.train(straight, rank, 6)
    first = _engine(gravac, world)
    M.train(first, rank, 3)
    _, saved_server = _residuals(first)
    ds_gravac.get_handle(first).save_checkpoint(save_dir, tag="k3")
    resumed = _engine(gravac, world)
    ds_gravac.get_handle(resumed).load_checkpoint(save_dir, tag="k3")
    _, loaded_server = _residuals(resumed)
    M.train(resumed, rank, 3, start=3)
    return {"straight": M.params_of(straight), "resumed": M.params_of(resumed), "saved": saved_server,
            "loaded": loaded_server}


def _nonfinite(rank: int, world: int) -> dict:
    engine = _engine({**BASE, "compressor": "onebit"}, world)
    for s in range(3):
        _step(engine, rank, s)
    before = _residuals(engine)
    _step(engine, rank, 3, poison=rank == 1)     # the dense average is NaN too, as in plain DeepSpeed: stop here
    after = _residuals(engine)
    return {"before": before, "after": after, "branch": engine._ds_gravac_handle.last_stats()["branch"]}


def _job(rank: int, world: int, save_dir: str) -> dict:
    return {"training": _training(rank, world), "aggregates": _aggregates(rank, world),
            "conservation": _conservation(rank, world), "checkpoint": _checkpoint(rank, world, save_dir),
            "nonfinite": _nonfinite(rank, world)}


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def run(request: pytest.FixtureRequest) -> tuple[int, list]:
    with tempfile.TemporaryDirectory() as save_dir:
        return request.param, run_ranks(_job, request.param, save_dir)


# ---- helpers of the float64 references -------------------------------------------------------------------------
def _flat(values: dict[str, torch.Tensor], bucket: list[tuple[str, int, int]]) -> torch.Tensor:
    """A bucket's flat values; a parameter that never got a gradient (``unused``) counts as zeros."""
    return torch.cat([values[name].reshape(-1) if name in values else torch.zeros(numel, dtype=torch.float64)
                      for name, _, numel in bucket])


def _partitions(x: torch.Tensor, world: int) -> torch.Tensor:
    """``[N, L]`` with the last partition zero-padded, as the exchange cuts a bucket."""
    size = math.ceil(x.numel() / world)
    return torch.cat([x, x.new_zeros(world * size - x.numel())]).view(world, size)


# ---- tests ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", WIRED + ("onebit/allgather", "tbq/moving"))
def test_replicas_identical_after_training(run: tuple, name: str) -> None:
    results = run[1]
    ref = results[0]["training"][name]
    assert ref["branch"] == "cand"
    for other in results[1:]:
        for key, value in ref["params"].items():
            assert torch.isfinite(value).all(), key
            assert torch.equal(value, other["training"][name]["params"][key]), key
    if "bytes" in ref:                   # headers (scales, norms) add a little to 1/CF of the dense bytes
        assert ref["bytes"] < 1.1 * ref["dense"] / ref["cf"], (ref["bytes"], ref["dense"], ref["cf"])


def test_auto_exchange_gathers_at_two_ranks_only_where_the_owner_would_only_reround(run: tuple) -> None:
    """``quantized_exchange: "auto"`` as the synchronizer resolves it with the real world size: the all-gather at
    two ranks for the averaging quantizers without a server residual, the parameter server otherwise."""
    world, results = run
    training = results[0]["training"]
    for name in WIRED:
        rerounds_only = name in ("terngrad", "ternary", "qsgd")
        want = "PayloadAllGather" if world == 2 and rerounds_only else "CaSyncPS"
        if name in ("fp16", "bf16"):
            want = "HalfAllReduce"                   # summable casts: one all-reduce in the half dtype
        assert training[name]["pattern"] == want, (world, name)


def test_static_level_defaults_to_the_compressors_cf(run: tuple) -> None:
    training = run[1][0]["training"]
    assert training["onebit"]["cf"] == 32.0 and training["signsgd"]["cf"] == 32.0


def test_signsgd_ps_is_the_majority_vote_and_allgather_the_mean_sign(run: tuple) -> None:
    world, results = run
    signs = [{n: torch.where(g >= 0, 1.0, -1.0).double() for n, g in r["aggregates"]["signsgd/ps"]["raw"].items()}
             for r in results]
    for name in signs[0]:
        votes = sum(s[name] for s in signs)
        majority = torch.where(votes >= 0, 1.0, -1.0)
        for r in results:
            assert torch.equal(r["aggregates"]["signsgd/ps"]["got"][name], majority), name
    raw_ag = [r["aggregates"]["signsgd/allgather"]["raw"] for r in results]
    for name in raw_ag[0]:
        mean = sum(torch.where(raw[name] >= 0, 1.0, -1.0).double() for raw in raw_ag) / world
        for r in results:
            assert torch.allclose(r["aggregates"]["signsgd/allgather"]["got"][name], mean, rtol=0, atol=1e-7), name


def test_onebit_ps_equals_allgather_when_reencoding_is_exact(run: tuple) -> None:
    """Identical inputs on all ranks: the merged partition is ``±s_j`` and re-encodes to itself, so the parameter
    server and the all-gather must both give ``s_j·sign(x)`` with ``s_j`` = the mean |x| over partition j."""
    world, results = run
    agg = results[0]["aggregates"]["onebit/ps"]
    for bucket in agg["layout"]:
        x = _flat(agg["raw"], bucket)
        parts = _partitions(x, world)
        want = (torch.where(parts >= 0, 1.0, -1.0).double() * parts.abs().mean(dim=1, keepdim=True))
        want = want.reshape(-1)[:x.numel()]
        for r in results:
            for exchange in ("ps", "allgather"):
                got = _flat(r["aggregates"][f"onebit/{exchange}"]["got"], bucket)
                assert torch.allclose(got, want, rtol=1e-6, atol=0), (exchange, float((got - want).abs().max()))


def test_fp16_aggregate_is_the_mean(run: tuple) -> None:
    """Summed in fp16 itself: within the half-precision roundings of the float64 mean."""
    world, results = run
    raws = [r["aggregates"]["fp16/auto"]["raw"] for r in results]
    for name in raws[0]:
        mean = sum(raw[name] for raw in raws) / world
        scale = sum(raw[name].abs() for raw in raws) / world
        roundings = 2 * world - 1                 # each x_w/N, then each partial sum (≤ scale in magnitude)
        bound = roundings * (2.0 ** -11 * scale + 2.0 ** -25)     # relative half ulp; absolute in the subnormals
        got = results[0]["aggregates"]["fp16/auto"]["got"][name]
        assert bool(((got - mean).abs() <= bound).all()), name
        for r in results[1:]:
            assert torch.equal(r["aggregates"]["fp16/auto"]["got"][name], got), name


@pytest.mark.parametrize("name", sorted(CONSERVING))
def test_error_feedback_conservation_with_server_residuals(run: tuple, name: str) -> None:
    """``Σ_t G_t + (1/N)·Σ_w r_w(T) + s(T) = Σ_t mean_w g_w(t)`` per element (s: every owner's partition)."""
    world, results = run
    cons = [r["conservation"][name] for r in results]
    server_seen = False
    for b, bucket in enumerate(cons[0]["layout"]):
        n = sum(numel for _, _, numel in bucket)
        sent = sum(_flat(agg, bucket) for agg in cons[0]["aggs"])
        inputs = sum(sum(_flat(raw, bucket) for raw in c["raws"]) for c in cons) / world
        worker = sum(c["worker"][b].double() for c in cons) / world
        server = torch.cat([c["server"][b].double() for c in cons])[:n]
        server_seen |= bool(server.abs().sum() > 0)
        lhs = sent + worker + server
        assert torch.allclose(lhs, inputs, rtol=0, atol=1e-5 * float(inputs.abs().max() + 1)), (
            float((lhs - inputs).abs().max()))
    assert server_seen, "the test must see non-zero server residuals"


def test_server_residuals_restored_exactly(run: tuple) -> None:
    results = run[1]
    for r in results:
        ck = r["checkpoint"]
        assert ck["saved"] and any(bool(t.any()) for t in ck["saved"].values())
        for b, t in ck["saved"].items():
            assert torch.equal(t, ck["loaded"][b]), b
        for key, value in ck["straight"].items():
            assert torch.equal(value, ck["resumed"][key]), key


def test_nonfinite_step_leaves_residuals_untouched(run: tuple) -> None:
    results = run[1]
    for r in results:
        nf = r["nonfinite"]
        assert nf["branch"] == "dense"
        for before, after in zip(nf["before"], nf["after"]):
            assert before and set(before) == set(after)
            for b in before:
                assert torch.equal(before[b], after[b]), b
