"""A long table continued on another machine: ``long_keep run`` keeps a seed's report and its dense run after every
system, ``restore`` writes that dense run into a new directory, ``fidelity run`` there trains only the missing
systems, and their rows equal the rows the original directory gave the same systems (mlp_screen, a few steps, the
real deepspeed launcher). The first directory also holds a shipped-style config file given as ``cfg:<file>``: the
fidelity benchmark's report compares it with dense at equal steps."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple, Optional

import pytest

from ds_gravac_bench import long_keep
from ds_gravac_bench.fidelity import build
from ds_gravac_bench.fidelity import main as fidelity
from ds_gravac_bench.fidelity_seeds import combine
from ds_gravac_bench.long_keep import restore, save

pytestmark = pytest.mark.launcher

ROOT = Path(__file__).resolve().parents[2]
COMPARED = ("final_loss", "dense_loss", "gap", "bytes_ratio", "steps_to_target", "steps_to_top1", "eval", "peak",
            "quiet_steps", "section_hash", "verdict")
ARGS = ["--task", "mlp_screen", "--steps", "4", "--micro-batch", "8", "--checkpoint-every", "2", "--seed", "5"]
SECTION = {"mode": "static", "compressor": {"type": "powersgd", "params": {"rank": 16}}, "min_compress_numel": 16384}


class FirstRun(NamedTuple):
    run_dir: Path
    kept: Path
    saved: list[list[str]]     # the systems each save kept, in order


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> FirstRun:
    """``long_keep run`` of dense, a config file (``cfg:``) and the defaults, recording every save."""
    tmp = tmp_path_factory.mktemp("long_keep")
    cfg = tmp / "mlp_lowrank.json"
    dense = json.loads((ROOT / "ds_configs" / "mlp_dense.json").read_text())
    cfg.write_text(json.dumps({**{k: v for k, v in dense.items() if k != "gravac"}, "gravac": SECTION}))
    saved: list[list[str]] = []

    def recording(run_dir: Path, into: Path, clusters: Optional[dict] = None) -> dict:
        table = save(run_dir, into, clusters)
        saved.append(sorted(r["id"] for r in table["systems"]))
        return table

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(long_keep, "save", recording)
        long_keep.main(["run", "--keep", str(tmp / "kept"), *ARGS, "--systems", f"ds_dense,cfg:{cfg},gv_default",
                        "--out", str(tmp / "first")])
    return FirstRun(tmp / "first", tmp / "kept", saved)


def _losses(run_dir: Path, sid: str) -> list[float]:
    lines = (run_dir / "systems" / sid / "steps.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if x.strip()]


def _rows(table: dict) -> dict[str, dict]:
    return {r["id"]: {k: r.get(k) for k in COMPARED} for r in table["systems"]}


def test_a_config_file_is_compared_with_dense_at_equal_steps(first: FirstRun, tmp_path: Path) -> None:
    run_dir, out = first.run_dir, tmp_path          # the report goes here: the shared run directory stays as run
    assert json.loads((run_dir / "meta.json").read_text())["runner_extra"][-2:] == ["--seed", "5"]
    fidelity(["report", str(run_dir), "--out", str(out)])
    res = json.loads((out / "fidelity.json").read_text())
    rows = {r["id"]: r for r in res["systems"]}
    assert set(rows) == {"ds_dense", "ddp_dense", "mlp_lowrank", "gv_default"} and res["reference"] == "ds_dense"
    mine, dense = rows["mlp_lowrank"], rows["ds_dense"]
    assert mine["family"] == "low-rank" and mine["steps"] == dense["steps"] == 4
    assert 0 < mine["bytes_ratio"] < 0.5 and dense["bytes_ratio"] == 1.0
    steps = [json.loads(x) for x in (run_dir / "systems" / "ds_dense" / "steps.jsonl").read_text().splitlines()]
    assert dense["final_loss"] != steps[-1]["loss"] or len(steps) == 1      # smoothed, not the raw last loss
    assert "| mlp_lowrank | low-rank |" in (out / "fidelity.md").read_text()
    assert (out / "plots" / "loss_vs_step.png").stat().st_size > 0
    assert json.loads((run_dir / "configs" / "mlp_lowrank.json").read_text())["gravac"] == SECTION


def test_a_kept_seed_continues_in_a_new_directory_against_the_same_dense_run(first: FirstRun,
                                                                             tmp_path: Path) -> None:
    kept, second = first.kept, tmp_path / "second"
    # kept after every system, not only at the end (a long invocation may never reach its end)
    assert first.saved == [["ddp_dense", "ds_dense"], ["ddp_dense", "ds_dense", "mlp_lowrank"],
                           ["ddp_dense", "ds_dense", "gv_default", "mlp_lowrank"]]
    kept_report = json.loads((kept / "fidelity.json").read_text())
    original = _rows(kept_report)
    assert original == _rows(build([first.run_dir], {}))                    # the run directory's own report
    assert original["ds_dense"]["eval"].get("eval/top1") is not None        # the held-out evaluation is kept too
    assert not any(p.startswith("/") for p in kept_report["runs"])         # no path of the machine that ran it

    # on another machine: the dense run restored, one system still missing
    assert restore(kept, second) == "ds_dense"
    assert _losses(second, "ds_dense") == _losses(first.run_dir, "ds_dense")   # bit for bit
    with pytest.raises(SystemExit, match="already holds runs"):
        restore(kept, second)
    timed = {"100mbit": {"time_s": 12.5}}                                    # as if a cluster run had timed dense
    (kept / "fidelity.json").write_text(json.dumps({**kept_report, "systems": [
        {**r, "rates": timed} if r["id"] == "ds_dense" else r
        for r in kept_report["systems"] if r["id"] != "gv_default"]}))      # as if the first run lacked gv_default
    first_meta = json.loads((kept / "reference.json").read_text())["meta"]
    fidelity(["run", *ARGS, "--systems", "ds_dense,gv_default", "--out", str(second)])
    assert not (second / "systems" / "ds_dense" / "ckpt").exists()          # dense was not trained again
    assert "| gv_default |" in (second / "fidelity.md").read_text()         # `fidelity run` writes its report

    table = save(second, kept)
    merged = _rows(table)
    assert merged == original                                                # every figure as the first machine's
    # saved again without its cluster runs: dense keeps the time they gave, and the settings of the run that made it
    assert next(r for r in table["systems"] if r["id"] == "ds_dense")["rates"] == timed
    assert json.loads((second / "meta.json").read_text())["env"] != first_meta["env"]
    assert json.loads((kept / "reference.json").read_text())["meta"] == first_meta
    # a kept directory is one seed of fidelity_seeds, as any kept report
    assert {r["id"] for r in combine([[kept]])["systems"]} == set(original)


def test_a_tuning_sweep_continues_from_its_kept_seeds_on_another_machine(first: FirstRun, tmp_path: Path) -> None:
    """``fidelity_sweep --keep``: a seed kept by an earlier machine (dense and three systems, no cost file) gets only
    its missing grid system trained here, against the restored dense run; the seed then holds every row, the cost
    of each system (the earlier machine's dense record included), and a third machine trains nothing at all."""
    import shutil

    from ds_gravac_bench.fidelity_sweep import COST_FILE, sweep

    keep = tmp_path / "keep"
    shutil.copytree(first.kept, keep / "seed5")
    common = dict(task="mlp_screen", seeds=[5], grid=["gv_default", "gv_qsgd8"], clusters={}, timeout=600.0,
                  checkpoint_every=2, keep=keep, steps=4, micro_batch=8)
    res = sweep(out=tmp_path / "here", **common)
    run_dir = tmp_path / "here" / "seed5"
    assert sorted(p.name for p in (run_dir / "systems").iterdir()) == ["ds_dense", "gv_qsgd8"]
    assert not (run_dir / "systems" / "ds_dense" / "ckpt").exists()          # restored, not trained again
    rows = _rows(json.loads((keep / "seed5" / "fidelity.json").read_text()))
    assert {k: v for k, v in rows.items() if k != "gv_qsgd8"} == _rows(build([first.run_dir], {}))
    assert rows["gv_qsgd8"]["bytes_ratio"] < 1.0
    first_meta = json.loads((first.run_dir / "meta.json").read_text())["systems"]
    cost = json.loads((keep / "seed5" / COST_FILE).read_text())
    assert set(cost) == {"ds_dense", "gv_qsgd8"} and cost["ds_dense"]["cpu_s"] == first_meta["ds_dense"]["cpu_s"]
    assert res["cpu_s"] == pytest.approx(cost["ds_dense"]["cpu_s"] + cost["gv_qsgd8"]["cpu_s"])
    # picks come from the grid only: the kept seed's static `mlp_lowrank` is not a candidate, gv_default (auto) adapts
    assert res["picks"]["steps"]["low-rank"] is None and "quantization" in res["picks"]["steps"]
    kept_sweep = json.loads((keep / "sweep.json").read_text())
    assert kept_sweep["picks"] == res["picks"] and kept_sweep["cpu_s"] == res["cpu_s"]

    # a system of the seed that is not in the grid (kept by another invocation) is not the sweep's cost
    (keep / "seed5" / COST_FILE).write_text(json.dumps({**cost, "mlp_lowrank": {"cpu_s": 1e6, "wall_s": 1e6}}))
    again = sweep(out=tmp_path / "elsewhere", **common)
    assert not (tmp_path / "elsewhere" / "seed5" / "systems" / "gv_qsgd8").exists()   # nothing trained
    assert {k: again[k] for k in ("picks", "cpu_s", "wall_s")} == {k: res[k] for k in ("picks", "cpu_s", "wall_s")}


def _other_machines_curve(kept: Path, run_dir: Path) -> None:
    """The dense run restored, then its step-2 loss moved by one float32 ulp: what another machine class's kept run
    looks like to this one (the AVX-512 AMD EPYC against the Intel Xeon's ResNet-18 curve: one ulp at step 2)."""
    import numpy as np

    assert restore(kept, run_dir) == "ds_dense"
    steps = run_dir / "systems" / "ds_dense" / "steps.jsonl"
    records = [json.loads(x) for x in steps.read_text().splitlines() if x.strip()]
    records[1]["loss"] = float(np.nextafter(np.float32(records[1]["loss"]), np.float32(np.inf)))
    steps.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_restored_dense_run_this_machine_does_not_reproduce_stops_training(first: FirstRun, tmp_path: Path) -> None:
    """Loopback (``fidelity run`` after ``restore``, as ``long_keep run`` and the sweep do) and a controller's run at a
    rate against it: both refuse before training anything, naming the step."""
    other = tmp_path / "other"
    _other_machines_curve(first.kept, other)
    with pytest.raises(SystemExit, match="leaves .* ds_dense curve .* at step 2"):
        fidelity(["run", *ARGS, "--systems", "ds_dense,gv_default", "--out", str(other)])
    assert not (other / "systems" / "gv_default").exists()                   # nothing was trained
    with pytest.raises(SystemExit, match="at step 2"):
        long_keep.main(["run", "--keep", str(tmp_path / "kept"), *ARGS, "--rate", "1gbit", "--against", str(other),
                        "--systems", "gv_auto", "--out", str(tmp_path / "cluster")])
    assert not (tmp_path / "cluster").exists() and not (tmp_path / "kept").exists()


def test_a_restored_dense_run_this_machine_reproduces_is_checked_once_and_trained_against(first: FirstRun,
                                                                                         tmp_path: Path) -> None:
    same = tmp_path / "same"
    assert restore(first.kept, same) == "ds_dense"
    fidelity(["run", *ARGS, "--systems", "ds_dense,gv_default", "--out", str(same)])
    checked = _losses(same / "machine-check", "ds_dense")
    assert checked == _losses(same, "ds_dense")[:len(checked)] and checked    # the check's own run, bit for bit
    assert _losses(same, "gv_default") == _losses(first.run_dir, "gv_default")


def test_long_keep_run_into_a_new_directory_restores_the_kept_dense_run_first(first: FirstRun, tmp_path: Path) -> None:
    """The same ``long_keep run`` command on another machine (no run directory yet) restores the kept dense run,
    checks this machine reproduces it, and trains only what the kept seed lacks; a kept seed of another seed is
    refused before anything runs."""
    import shutil

    kept, new = tmp_path / "kept", tmp_path / "new"
    shutil.copytree(first.kept, kept)
    if any(r["id"] == "gv_default" for r in json.loads((kept / "fidelity.json").read_text())["systems"]):
        long_keep.drop(kept, ["gv_default"])
    long_keep.main(["run", "--keep", str(kept), *ARGS, "--systems", "ds_dense,gv_default", "--out", str(new)])
    assert (new / "systems" / "ds_dense" / "restored.json").is_file()        # restored, not trained again
    assert (new / "machine-check" / "systems" / "ds_dense").is_dir()         # and checked on this machine
    assert _losses(new, "gv_default") == _losses(first.run_dir, "gv_default")
    assert "gv_default" in {r["id"] for r in json.loads((kept / "fidelity.json").read_text())["systems"]}
    other_seed = [a if a != "5" else "6" for a in ARGS]
    with pytest.raises(SystemExit, match="keeps the dense run of task 'mlp_screen', seed 5, not 'mlp_screen', seed 6"):
        long_keep.main(["run", "--keep", str(kept), *other_seed, "--systems", "gv_default", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()
