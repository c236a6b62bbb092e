"""Shared cases of the fidelity report tests: bench_e2e-shaped run directories written by hand, two loss curves
(dense, and one with half its progress per step) and a loopback/cluster pair of directories as a fixture."""
from __future__ import annotations

import json
from pathlib import Path

import pytest



def _write_run(root: Path, model: str, systems: dict[str, dict], **meta_extra: object) -> Path:
    """A bench_e2e-shaped directory: meta.json, configs/<id>.json, systems/<id>/steps.jsonl. A system may give
    ``evals`` (step → eval metrics), a declared ``family`` and a ``returncode`` (then ``log`` is its log.txt);
    ``time`` and ``bytes`` are one value for every step or a list of per-step values."""
    (root / "configs").mkdir(parents=True)
    meta = {"model": model, "steps": max(len(s["loss"]) for s in systems.values()), "env": {}, "systems": {},
            **meta_extra}
    for sid, s in systems.items():
        meta["systems"][sid] = {"returncode": s.get("returncode", 0), "family": s.get("family"),
                                **({"dense_start": s["dense_start"]} if "dense_start" in s else {})}
        if s.get("gravac") is not None:
            (root / "configs" / f"{sid}.json").write_text(json.dumps({"gravac": s["gravac"]}))
        d = root / "systems" / sid
        d.mkdir(parents=True)
        recs = [{"step": i + 1, "loss": loss, "time/step": s["time"][i] if isinstance(s["time"], list) else s["time"],
                 "bytes_sent": s["bytes"][i] if isinstance(s["bytes"], list) else s["bytes"]}
                for i, loss in enumerate(s["loss"])]
        if s.get("eval"):
            recs[-1].update(s["eval"])
        for step, metrics in s.get("evals", {}).items():
            recs[step - 1].update(metrics)
        d.joinpath("steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        if "log" in s:
            d.joinpath("log.txt").write_text(s["log"])
    (root / "meta.json").write_text(json.dumps(meta))
    return root


DENSE = [3.0 - 0.02 * i for i in range(100)]          # falls linearly: 3.0 → 1.02
SLOW = [3.0 - 0.01 * i for i in range(100)]           # half the progress per step
STATIC = {"mode": "static", "compressor": "topk", "cf": 100}
GRAVAC = {"mode": "gravac", "compressor": "topk"}


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    loop = _write_run(tmp_path / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None, "eval": {"eval/top1": 0.9}},
        "gv_topk_100": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC, "eval": {"eval/top1": 0.89}},
        "gv_slow": {"loss": SLOW, "time": 0.1, "bytes": 10.0, "gravac": STATIC, "eval": {"eval/top1": 0.5}},
        "gv_gravac": {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": GRAVAC},
    })
    cluster = _write_run(tmp_path / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE[:20], "time": 0.5, "bytes": 10.0, "gravac": STATIC},
        # its own cluster run learns on a different trajectory (link-dependent decisions): time from that run
        "gv_gravac": {"loss": SLOW, "time": [0.25] * 100, "bytes": 10.0, "gravac": GRAVAC},
    })
    return loop, cluster


def _top1_curve(steps_to: dict[int, float]) -> dict[int, dict[str, float]]:
    return {step: {"eval/top1": top1} for step, top1 in steps_to.items()}


def loop_and_cluster(root: Path, static_id: str = "gv_topk_100") -> tuple[Path, Path]:
    """Dense and a static Top-k row (as ``static_id``) on loopback, 0.1 s a step; both on a cluster (the static
    row as ``gv_topk_100``), 2.0 and 0.5 s a step."""
    loop = _write_run(root / "loop", "mlp", {
        "ds_dense": {"loss": DENSE, "time": 0.1, "bytes": 1000.0, "gravac": None},
        static_id: {"loss": DENSE, "time": 0.1, "bytes": 10.0, "gravac": STATIC}})
    cluster = _write_run(root / "c1g", "mlp", {
        "ds_dense": {"loss": DENSE[:20], "time": 2.0, "bytes": 1000.0, "gravac": None},
        "gv_topk_100": {"loss": DENSE[:20], "time": 0.5, "bytes": 10.0, "gravac": STATIC}})
    return loop, cluster
