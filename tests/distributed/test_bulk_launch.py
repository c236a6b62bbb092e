"""Bulk synchronization (``bulk: true``): buckets that one hook completes together are staged and encoded back to
back and their collectives issued together afterwards; ``bulk: false`` issues each bucket's collective right after
its own encode. Either way the results are bitwise the same (the collectives and their order do not change).

The order is observed on real gloo ranks by logging our own encode and collective-issue calls; with
``overlap: false`` every bucket becomes ready at the end of backward, in one hook.
"""
from __future__ import annotations

import pytest
import torch

import models as M
from harness import run_ranks

STEPS = 4
BASE = {"mode": "static", "bucket_cap_mb": 0.02, "min_compress_numel": 1000}
COMPRESSORS = {"topk": {"compressor": "topk", "cf": 10},
               "powersgd": {"compressor": {"type": "powersgd", "params": {"rank": 2}}}}


def _run(rank: int, world: int, comp: str, bulk: bool, overlap: bool) -> dict:
    import ds_gravac
    import ds_gravac.sync.collectives as coll
    from ds_gravac.sync.codec import BucketCodec
    events: list[str] = []
    issue, encode = coll._launch, BucketCodec.encode

    def logged_issue(what: str, *args: object, **kw: object) -> object:
        events.append("issue:" + what)
        return issue(what, *args, **kw)

    def logged_encode(self: object, *args: object, **kw: object) -> object:
        events.append("encode")
        return encode(self, *args, **kw)
    coll._launch, BucketCodec.encode = logged_issue, logged_encode
    try:
        model = M.make_model(seed=0)
        gravac = {**BASE, **COMPRESSORS[comp], "bulk": bulk, "overlap": overlap}
        engine, *_ = ds_gravac.initialize(model=model, model_parameters=model.parameters(),
                                          config=M.ds_config(gravac, world=world))
        steps = []
        for s in range(STEPS):
            events.clear()
            M.train(engine, rank, 1, start=s)
            steps.append(list(events))
    finally:
        coll._launch, BucketCodec.encode = issue, encode
    return {"params": M.params_of(engine), "events": steps}


def _job(rank: int, world: int) -> dict:
    return {(comp, bulk, overlap): _run(rank, world, comp, bulk, overlap)
            for comp in COMPRESSORS for bulk in (True, False) for overlap in (True, False)}


@pytest.fixture(scope="module")
def results() -> list:
    return run_ranks(_job, 2)


def _first_round(events: list[str]) -> list[str]:
    """Encodes and first-round data collectives of the buckets (not the statistics or later rounds)."""
    return [e for e in events if e == "encode" or (e.startswith("issue:") and "bucket" in e and "round 2" not in e)]


@pytest.mark.parametrize("comp", sorted(COMPRESSORS))
def test_bulk_encodes_every_ready_bucket_before_issuing(results: list, comp: str) -> None:
    for steps in (out[(comp, True, False)]["events"] for out in results):
        for events in steps[1:]:                      # step 0 discovers the bucket order (dense)
            seq = _first_round(events)
            assert seq.count("encode") >= 2, seq
            last_encode = max(i for i, e in enumerate(seq) if e == "encode")
            first_issue = min(i for i, e in enumerate(seq) if e != "encode")
            assert last_encode < first_issue, seq


@pytest.mark.parametrize("comp", sorted(COMPRESSORS))
def test_without_bulk_each_bucket_is_issued_after_its_own_encode(results: list, comp: str) -> None:
    for steps in (out[(comp, False, False)]["events"] for out in results):
        for events in steps[1:]:
            seq = _first_round(events)
            first_issue = min(i for i, e in enumerate(seq) if e != "encode")
            assert any(e == "encode" for e in seq[first_issue:]), seq


@pytest.mark.parametrize("comp", sorted(COMPRESSORS))
def test_bulk_does_not_change_the_result(results: list, comp: str) -> None:
    for out in results:
        ref = out[(comp, False, True)]["params"]
        for key in ((comp, True, True), (comp, True, False), (comp, False, False)):
            for name in ref:
                assert torch.equal(out[key]["params"][name], ref[name]), (key, name)
    for name in results[0][(comp, True, True)]["params"]:
        assert torch.equal(results[0][(comp, True, True)]["params"][name],
                           results[1][(comp, True, True)]["params"][name]), name
