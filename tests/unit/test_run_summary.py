"""The runner's end-of-run summary compares the smoothed loss with a reference run (make train's dense run) at the
same step, with the same smoothing, and says so when it cannot."""
from __future__ import annotations

import json
from pathlib import Path

from runners.logging_utils import LOSS_EWMA_ALPHA, Summary


def _records(losses: list[float]) -> list[dict]:
    return [{"step": i + 1, "loss": v, "time/step": 0.5} for i, v in enumerate(losses)]


def _ewma(values: list[float]) -> float:
    acc = values[0]
    for v in values[1:]:
        acc = (1 - LOSS_EWMA_ALPHA) * acc + LOSS_EWMA_ALPHA * v
    return acc


def _summary(losses: list[float]) -> Summary:
    s = Summary()
    for rec in _records(losses):
        s.add(rec)
    return s


def test_reference_line_at_the_same_step(tmp_path: Path) -> None:
    ref = tmp_path / "dense" / "steps.jsonl"
    ref.parent.mkdir()
    dense = [2.0, 1.8, 1.5, 1.2, 1.0, 0.9]
    ref.write_text("".join(json.dumps(r) + "\n" for r in _records(dense)))
    mine = [2.0, 1.9, 1.7, 1.5]
    lines = _summary(mine).lines("hdr", 0.0, None, str(tmp_path / "me" / "steps.jsonl"), str(ref))
    line = next(x for x in lines if x.startswith("vs reference"))
    a, b = _ewma(mine), _ewma(dense[:4])
    assert f"step 4: loss (EWMA) {a:.4f} here, {b:.4f} there ({100 * (a / b - 1):+.1f}%" in line


def test_no_reference_no_line_and_short_reference_is_named(tmp_path: Path) -> None:
    me = str(tmp_path / "steps.jsonl")
    assert not any(x.startswith(("vs reference", "reference")) for x in _summary([1.0, 0.9]).lines(
        "hdr", 0.0, None, me, str(tmp_path / "missing.jsonl")))
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps(r) + "\n" for r in _records([1.0])))
    lines = _summary([1.0, 0.9]).lines("hdr", 0.0, None, me, str(short))
    assert any("no step 2 there (it ran 1 steps)" in x for x in lines)
    own = tmp_path / "own.jsonl"                       # a run never compares with itself
    own.write_text("".join(json.dumps(r) + "\n" for r in _records([1.0, 0.9])))
    assert not any(x.startswith(("vs reference", "reference")) for x in
                   _summary([1.0, 0.9]).lines("hdr", 0.0, None, str(own), str(own)))


def test_timeline_names_ranks_of_low_rank_compressors() -> None:
    s = Summary()
    for i, (branch, level, kind) in enumerate([("dense", 1.0, "rank"), ("cand", 16.0, "rank"), ("cand", 16.0, "rank"),
                                               ("cand", 100.0, "cf")]):
        s.add({"step": i + 1, "loss": 1.0, "time/step": 0.1, "branch": branch, "cf_sent": level, "level_kind": kind})
    line = next(x for x in s.lines("hdr", 0.0, None, "x.jsonl") if x.startswith("CF timeline"))
    assert line.endswith("dense@1x x1 [1-1], cand@rank 16 x2 [2-3], cand@100x x1 [4-4]")
