"""Chunked pipelining inside a bucket (cost-model selection, ``cost_model.max_chunks``) on real gloo ranks.

Fits are injected on every rank (identical by construction) under which more chunks are always faster (no fixed
costs, encode and link comparable), so the plan takes the most chunks the rule allows: ``K ∈ {1, 2, 4, …}``, at
most ``max_chunks``, at most one per member, ``m/K ≥ 4096``. Checked: chunking does not change the math — Top-k
(all-gather) and Random-k / fp16 (all-reduce) train to bitwise the same parameters and error-feedback memory as
K = 1, also across a step with an Inf gradient, with ``bulk`` and without overlap; replicas stay identical; bytes
and values sent per step are those of K = 1; records carry the planned chunk count. And the chunks overlap: on
real ranks a bucket's first chunk is issued before its last chunk is encoded, and every channel sees the
collectives in (bucket, chunk) order. One spawn runs every job.
"""
from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import nn

import models as M
from harness import run_ranks

STEPS, BAD_STEP = 6, 3
BASE = {"mode": "static", "cf": 10, "bucket_cap_mb": 0.2, "min_compress_numel": 1000, "selection": "cost_model",
        "debug": {"check_plans": True}}
RUNS = {   # name: (compressor, max_chunks, extra keys)
    "topk_k1": ("topk", 1, {}), "topk_k2": ("topk", 2, {}), "topk_k4": ("topk", 4, {}),
    "topk_k4_no_overlap": ("topk", 4, {"overlap": False}), "topk_k4_no_bulk": ("topk", 4, {"bulk": False}),
    "randomk_k1": ("randomk", 1, {}), "randomk_k4": ("randomk", 4, {}),
    "fp16_k1": ("fp16", 1, {}), "fp16_k4": ("fp16", 4, {}),
}


def _fits() -> Any:
    """No fixed costs; encode and link of the same order: every extra chunk shortens the pipeline."""
    from ds_gravac.sync.cost_model.fits import FitTable, LinearFit
    return FitTable({"all_reduce": LinearFit(0.0, 1e-8), "all_gather": LinearFit(0.0, 1e-8),
                     "stage": LinearFit(0.0, 1e-10), "writeback": LinearFit(0.0, 1e-10),
                     "encode@10": LinearFit(0.0, 8e-9), "decode@10": LinearFit(0.0, 1e-10)})


def _run(rank: int, world: int, comp: str, max_chunks: int, extra: dict) -> dict:
    """Train ``STEPS`` steps; rank 1's first hidden weight gets an Inf at ``BAD_STEP``, whose optimizer step the
    loop skips. Logs our encode calls and collective issues per step."""
    import ds_gravac
    import ds_gravac.sync.collectives as coll
    from ds_gravac.sync.codec import BucketCodec
    events: list[tuple[str, Any]] = []
    issue, encode = coll._launch, BucketCodec.encode

    def logged_issue(what: str, *args: Any, **kw: Any) -> Any:
        events.append(("issue", what))
        return issue(what, *args, **kw)

    def logged_encode(self: Any, *args: Any, **kw: Any) -> Any:
        events.append(("encode", self.bucket.index))
        return encode(self, *args, **kw)
    gravac = {**BASE, "compressor": comp, "cost_model": {"calibrate": False, "refit_interval": 0,
                                                         "max_chunks": max_chunks}, **extra}
    model = M.make_model(seed=0, width=128)
    step = {"i": 0}
    model.hidden[0].weight.register_hook(
        lambda g: g.clone().fill_(float("inf")) if rank == 1 and step["i"] == BAD_STEP else g)
    engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                      config=M.ds_config(gravac, world=world))
    handle = ds_gravac.get_handle(engine)
    handle.sync.planner.selector.set_fits(_fits())
    coll._launch, BucketCodec.encode = logged_issue, logged_encode
    per_step, memory_around_bad = [], []
    try:
        for s in range(STEPS):
            step["i"] = s
            events.clear()
            if s == BAD_STEP:
                memory_around_bad.append(handle.sync.memory.state_dict()["slots"])
            x, y = M.batch(rank, s)
            engine.backward(nn.functional.cross_entropy(engine(x), y))
            if all(bool(torch.isfinite(p.grad).all()) for p in engine.module.parameters()):
                engine.step()
            else:
                engine.zero_grad()
            if s == BAD_STEP:
                memory_around_bad.append(handle.sync.memory.state_dict()["slots"])
            per_step.append(list(events))
    finally:
        coll._launch, BucketCodec.encode = issue, encode
    members = [[m.numel for m in b.members] for b in handle.sync.plan.buckets if b.compressible]
    return {"params": M.params_of(engine), "memory": handle.sync.memory.state_dict()["slots"],
            "records": handle.pop_stats(), "events": per_step, "members": members,
            "memory_around_bad": memory_around_bad}


def _all_jobs(rank: int, world: int) -> dict:
    return {name: _run(rank, world, *spec) for name, spec in RUNS.items()}


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_all_jobs, 2)


def _same(a: dict, b: dict) -> bool:
    """Bitwise equality of nested dicts of tensors."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def _expected_chunks(members: list[int], max_chunks: int) -> int:
    """The most chunks the rule allows: a power of two, ≤ max_chunks, ≤ one per member, m/K ≥ 4096."""
    k = 1
    while 2 * k <= min(max_chunks, len(members)) and sum(members) >= 4096 * 2 * k:
        k *= 2
    return k


@pytest.mark.parametrize("name", sorted(RUNS))
def test_plans_take_the_chunks_the_formula_favours(results: list[dict], name: str) -> None:
    r0, r1 = results[0][name], results[1][name]
    members, max_chunks = r0["members"], RUNS[name][1]
    if name == "topk_k4":
        assert [len(ms) for ms in members] == [4, 2] and min(sum(ms) for ms in members) >= 2 * 4096, members
    expected = [_expected_chunks(ms, max_chunks) for ms in members]
    assert [row["chunks"] for row in r0["records"][0]["cost_model/buckets"]] == [1] * len(members)
    for rec in r0["records"][1:]:                # step 0 discovers the bucket order (dense)
        rows = rec["cost_model/buckets"]
        assert all(row["choice"] == "compress" for row in rows), rows
        assert [row["chunks"] for row in rows] == expected, (members, rows)
    assert ([[row["chunks"] for row in rec["cost_model/buckets"]] for rec in r0["records"]] ==
        [[row["chunks"] for row in rec["cost_model/buckets"]] for rec in r1["records"]])
    if max_chunks > 1:
        assert max(expected) == max_chunks


@pytest.mark.parametrize("name, reference", [(n, f"{RUNS[n][0]}_k1") for n in sorted(RUNS) if not n.endswith("k1")])
def test_chunking_does_not_change_the_math(results: list[dict], name: str, reference: str) -> None:
    for out in results:
        assert _same(out[name]["params"], out[reference]["params"]), name
        assert _same(out[name]["memory"], out[reference]["memory"]), name
        sent = [(r["bytes_sent"], r["values_sent"]) for r in out[name]["records"]]
        assert sent == [(r["bytes_sent"], r["values_sent"]) for r in out[reference]["records"]]
    assert _same(results[0][name]["params"], results[1][name]["params"])        # replicas identical
    assert all(torch.isfinite(p).all() for p in results[0][name]["params"].values())


def test_a_non_finite_step_leaves_the_memory_untouched(results: list[dict]) -> None:
    for out in results:
        before, after = out["topk_k4"]["memory_around_bad"]
        assert _same(before, after)
        bad = out["topk_k4"]["records"][BAD_STEP]
        assert bad["nonfinite"] > 0 and bad["branch"] == "dense"


CHUNK = re.compile(r"bucket (\d+) .*?(?:chunk (\d+)/(\d+))?$")


def _bucket_issues(events: list[tuple[str, Any]]) -> list[tuple[int, int, int, int]]:
    """(position, bucket, chunk, chunks) of every bucket collective issued, in issue order."""
    out = []
    for pos, (kind, what) in enumerate(events):
        m = CHUNK.search(what) if kind == "issue" and "bucket" in what and "non-finite" not in what else None
        if m:
            out.append((pos, int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1)))
    return out


@pytest.mark.parametrize("name", ["topk_k4", "topk_k4_no_overlap", "topk_k4_no_bulk", "randomk_k4"])
def test_chunks_are_issued_while_later_chunks_are_encoded(results: list[dict], name: str) -> None:
    for out in results:
        for events in out[name]["events"][1:]:
            issues = _bucket_issues(events)
            assert [(b, c) for _, b, c, _ in issues] == sorted((b, c) for _, b, c, _ in issues)   # plan order
            chunked = {b for _, b, _, k in issues if k > 1}
            assert chunked, issues
            for b in chunked:
                encodes = [pos for pos, (kind, what) in enumerate(events) if kind == "encode" and what == b]
                first_issue = min(pos for pos, bb, c, _ in issues if bb == b and c == 1)
                assert len(encodes) == max(k for _, bb, _, k in issues if bb == b)      # one encode per chunk
                assert first_issue < encodes[-1], events
