"""A long table continued on another machine: ``long_keep save`` keeps a seed's report and its dense run,
``restore`` writes that dense run into a new directory, ``fidelity run`` there trains only the missing systems, and
their rows equal the rows the original directory gave the same systems (mlp_screen, a few steps, the real deepspeed
launcher)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ds_gravac_bench.fidelity import main as fidelity
from ds_gravac_bench.fidelity_seeds import combine
from ds_gravac_bench.long_keep import restore, save

pytestmark = pytest.mark.launcher

COMPARED = ("final_loss", "dense_loss", "gap", "bytes_ratio", "steps_to_target", "steps_to_top1", "eval", "peak",
            "quiet_steps", "section_hash", "verdict")


def _run(out: Path, systems: str) -> None:
    fidelity(["run", "--task", "mlp_screen", "--steps", "4", "--micro-batch", "8", "--systems", systems,
              "--checkpoint-every", "2", "--seed", "5", "--out", str(out)])


def _losses(run_dir: Path, sid: str) -> list[float]:
    lines = (run_dir / "systems" / sid / "steps.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if x.strip()]


def _rows(table: dict) -> dict[str, dict]:
    return {r["id"]: {k: r.get(k) for k in COMPARED} for r in table["systems"]}


def test_a_kept_seed_continues_in_a_new_directory_against_the_same_dense_run(tmp_path: Path) -> None:
    first, kept, second = tmp_path / "first", tmp_path / "kept", tmp_path / "second"
    _run(first, "ds_dense,gv_topk_100,gv_default")
    original = _rows(json.loads((first / "fidelity.json").read_text()))
    assert original["ds_dense"]["eval"].get("eval/top1") is not None     # the held-out evaluation is kept too

    # the first machine kept the dense run and one system; the second trains what is missing
    save(first, kept)
    kept_report = json.loads((kept / "fidelity.json").read_text())
    assert set(_rows(kept_report)) == set(original) == {"ds_dense", "ddp_dense", "gv_topk_100", "gv_default"}
    assert not any(p.startswith("/") for p in kept_report["runs"])         # no path of the machine that ran it

    assert restore(kept, second) == "ds_dense"
    assert _losses(second, "ds_dense") == _losses(first, "ds_dense")          # bit for bit
    with pytest.raises(SystemExit, match="already holds runs"):
        restore(kept, second)
    (kept / "fidelity.json").write_text(json.dumps({**kept_report, "systems": [
        r for r in kept_report["systems"] if r["id"] != "gv_default"]}))      # as if the first run lacked it
    _run(second, "ds_dense,gv_default")
    assert not (second / "systems" / "ds_dense" / "ckpt").exists()          # dense was not trained again

    merged = _rows(save(second, kept))
    assert merged == original                                                # every figure as the first machine's
    # a kept directory is one seed of fidelity_seeds, as any kept report
    assert {r["id"] for r in combine([[kept]])["systems"]} == set(original)
