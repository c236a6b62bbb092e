"""long_status reads each system's state off a run directory the way a continued invocation would."""
from __future__ import annotations

import json
from pathlib import Path

from ds_gravac_bench.long_status import markdown, status


def _system(run: Path, sid: str, logged: int, ckpt_steps: tuple[int, ...] = (), ranks_written: int = 2) -> None:
    d = run / "systems" / sid
    d.mkdir(parents=True)
    d.joinpath("steps.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                                                 for s in range(1, logged + 1)))
    for step in ckpt_steps:
        tag = d / "ckpt" / f"step{step}"
        tag.mkdir(parents=True)
        for r in range(ranks_written):
            (tag / f"runner_rank{r:05d}.pt").write_bytes(b"x")


def test_each_system_is_done_resumable_failed_pending_or_restarting(tmp_path: Path) -> None:
    run = tmp_path / "long" / "r18-s0"
    _system(run, "done", 100)
    _system(run, "half", 60, ckpt_steps=(25, 50))
    _system(run, "torn", 60, ckpt_steps=(50,), ranks_written=1)       # rank 1 never finished writing step 50
    _system(run, "crashed", 7)
    _system(run, "unlisted", 3)
    systems = {"done": {"returncode": 0, "cpu_s": 7200.0}, "half": {"returncode": -9},
               "torn": {"returncode": 0}, "crashed": {"returncode": 1}, "queued": {"returncode": None}}
    (run / "meta.json").write_text(json.dumps({"steps": 100, "N": 2, "network": {"rate": "loopback"},
                                               "systems": systems}))
    rows = {r["system"]: r for r in status(tmp_path / "long")}
    assert {s: r["state"] for s, r in rows.items()} == {
        "done": "done", "half": "resumes at 50", "torn": "restarts (step 60 logged, no checkpoint)",
        "crashed": "failed (exit 1)", "queued": "pending", "unlisted": "restarts (step 3 logged, no checkpoint)"}
    assert rows["done"]["cpu_h"] == 2.0 and rows["half"]["logged"] == 60
    assert "| r18-s0 | loopback | half | 60 / 100 | resumes at 50 | – |" in markdown(list(rows.values()))


def test_kept_seeds_are_listed_with_their_systems(tmp_path: Path) -> None:
    from ds_gravac_bench.long_status import kept, kept_markdown

    seed = tmp_path / "long" / "resnet18_long-s0"
    seed.mkdir(parents=True)
    (seed / "fidelity.json").write_text(json.dumps({"steps": 6000, "systems": [{"id": "ds_dense"},
                                                                               {"id": "ds_dense_jitter"}]}))
    (tmp_path / "long" / "empty").mkdir()
    rows = kept(tmp_path / "long")
    assert rows == [{"dir": "resnet18_long-s0", "steps": 6000, "systems": ["ds_dense", "ds_dense_jitter"]}]
    assert "| resnet18_long-s0 | 6000 | ds_dense, ds_dense_jitter |" in kept_markdown(rows)
