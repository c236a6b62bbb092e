"""A long table continued on another machine: ``long_keep run`` keeps a seed's report and its dense run after every
system, ``restore`` writes that dense run into a new directory, ``fidelity run`` there trains only the missing
systems, and their rows equal the rows the original directory gave the same systems (mlp_screen, a few steps, the
real deepspeed launcher)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from ds_gravac_bench import long_keep
from ds_gravac_bench.fidelity import build
from ds_gravac_bench.fidelity import main as fidelity
from ds_gravac_bench.fidelity_seeds import combine
from ds_gravac_bench.long_keep import restore, save

pytestmark = pytest.mark.launcher

COMPARED = ("final_loss", "dense_loss", "gap", "bytes_ratio", "steps_to_target", "steps_to_top1", "eval", "peak",
            "quiet_steps", "section_hash", "verdict")


ARGS = ["--task", "mlp_screen", "--steps", "4", "--micro-batch", "8", "--checkpoint-every", "2", "--seed", "5"]


def _losses(run_dir: Path, sid: str) -> list[float]:
    lines = (run_dir / "systems" / sid / "steps.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if x.strip()]


def _rows(table: dict) -> dict[str, dict]:
    return {r["id"]: {k: r.get(k) for k in COMPARED} for r in table["systems"]}


def test_a_kept_seed_continues_in_a_new_directory_against_the_same_dense_run(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    first, kept, second = tmp_path / "first", tmp_path / "kept", tmp_path / "second"
    saved: list[list[str]] = []

    def recording(run_dir: Path, into: Path, clusters: Optional[dict] = None) -> dict:
        table = save(run_dir, into, clusters)
        saved.append(sorted(r["id"] for r in table["systems"]))
        return table

    monkeypatch.setattr(long_keep, "save", recording)
    long_keep.main(["run", "--keep", str(kept), *ARGS, "--systems", "ds_dense,gv_topk_100,gv_default",
                    "--out", str(first)])
    # kept after every system, not only at the end (a long invocation may never reach its end)
    assert saved == [["ddp_dense", "ds_dense"], ["ddp_dense", "ds_dense", "gv_topk_100"],
                     ["ddp_dense", "ds_dense", "gv_default", "gv_topk_100"]]
    kept_report = json.loads((kept / "fidelity.json").read_text())
    original = _rows(kept_report)
    assert original == _rows(build([first], {}))                             # the run directory's own report
    assert original["ds_dense"]["eval"].get("eval/top1") is not None        # the held-out evaluation is kept too
    assert not any(p.startswith("/") for p in kept_report["runs"])         # no path of the machine that ran it

    # on another machine: the dense run restored, one system still missing
    assert restore(kept, second) == "ds_dense"
    assert _losses(second, "ds_dense") == _losses(first, "ds_dense")          # bit for bit
    with pytest.raises(SystemExit, match="already holds runs"):
        restore(kept, second)
    timed = {"100mbit": {"time_s": 12.5}}                                    # as if a cluster run had timed dense
    (kept / "fidelity.json").write_text(json.dumps({**kept_report, "systems": [
        {**r, "rates": timed} if r["id"] == "ds_dense" else r
        for r in kept_report["systems"] if r["id"] != "gv_default"]}))      # as if the first run lacked gv_default
    first_meta = json.loads((kept / "reference.json").read_text())["meta"]
    fidelity(["run", *ARGS, "--systems", "ds_dense,gv_default", "--out", str(second)])
    assert not (second / "systems" / "ds_dense" / "ckpt").exists()          # dense was not trained again

    table = save(second, kept)
    merged = _rows(table)
    assert merged == original                                                # every figure as the first machine's
    # saved again without its cluster runs: dense keeps the time they gave, and the settings of the run that made it
    assert next(r for r in table["systems"] if r["id"] == "ds_dense")["rates"] == timed
    assert json.loads((second / "meta.json").read_text())["env"] != first_meta["env"]
    assert json.loads((kept / "reference.json").read_text())["meta"] == first_meta
    # a kept directory is one seed of fidelity_seeds, as any kept report
    assert {r["id"] for r in combine([[kept]])["systems"]} == set(original)
