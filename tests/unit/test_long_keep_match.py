"""``long_keep match``: whether a run directory's dense run is a kept seed's curve bit for bit — the check that
this machine can continue that seed — and, with ``--row``, whether a compressed run gives its kept row."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ds_gravac_bench.long_keep import main, match, match_row, restore, save

KEPT = Path(__file__).resolve().parents[2] / "docs" / "bench" / "long"
INTEL, AMD = KEPT / "resnet18_long-s0-intel", KEPT / "resnet18_long-s0"


def _steps(run_dir: Path) -> Path:
    return run_dir / "systems" / "ds_dense" / "steps.jsonl"


def test_the_kept_run_itself_matches_over_every_step(tmp_path: Path) -> None:
    restore(INTEL, tmp_path / "run")
    assert match(INTEL, tmp_path / "run") == (6000, None)


def test_another_machines_run_of_the_same_seed_does_not(tmp_path: Path) -> None:
    """Seed 0's dense run kept from the AVX2 AMD EPYC against the one kept from the Intel Xeon: their first losses
    already differ in the last bits (5.015783 / 5.0157833)."""
    restore(AMD, tmp_path / "run")
    assert match(INTEL, tmp_path / "run") == (6000, 1)


def test_a_partial_run_one_ulp_off_at_step_2_differs_there(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    restore(INTEL, tmp_path / "run")
    records = [json.loads(x) for x in _steps(tmp_path / "run").read_text().splitlines()][:300]
    main(["match", str(INTEL), str(tmp_path / "run")])
    assert "bit for bit over 6000 steps" in capsys.readouterr().out
    loss = np.float32(records[1]["loss"])
    records[1]["loss"] = float(np.nextafter(loss, np.float32(np.inf)))
    _steps(tmp_path / "run").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert match(INTEL, tmp_path / "run") == (300, 2)
    with pytest.raises(SystemExit, match="leaves .* dense curve at step 2"):
        main(["match", str(INTEL), str(tmp_path / "run")])
    _steps(tmp_path / "run").write_text("")
    with pytest.raises(SystemExit, match="holds no step yet"):
        match(INTEL, tmp_path / "run")


TOPK = {"gravac": {"mode": "static", "compressor": "topk", "cf": 100}}


def _with_topk(root: Path, dense: Path) -> Path:
    """``root`` (made if new) with a run of ``gv_topk_100`` added: the kept dense run's steps (``dense``), 1% higher,
    at a 43rd of the bytes."""
    (root / "configs").mkdir(parents=True, exist_ok=True)
    meta = json.loads((root / "meta.json").read_text()) if (root / "meta.json").is_file() else {"systems": {}}
    records = [{**r, "loss": float(np.float32(r["loss"] * 1.01)), "bytes_sent": r["bytes_sent"] // 43}
               for r in map(json.loads, dense.read_text().splitlines())]
    (root / "systems" / "gv_topk_100").mkdir(parents=True)
    (root / "systems" / "gv_topk_100" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "configs" / "gv_topk_100.json").write_text(json.dumps(TOPK))
    meta["systems"]["gv_topk_100"] = {"returncode": 0, "family": None}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def test_a_compressed_run_gives_its_kept_row_or_names_the_fields_it_changes(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture) -> None:
    """``match --row``: a kept row re-trained elsewhere (a directory without a dense run) is judged against the
    kept dense curve; the same steps give the kept row, one evaluation or the last loss changed does not."""
    restore(INTEL, tmp_path / "trained")                    # the machine that trained it had the dense run beside it
    save(_with_topk(tmp_path / "trained", _steps(tmp_path / "trained")), tmp_path / "kept")
    elsewhere = _with_topk(tmp_path / "elsewhere", _steps(tmp_path / "trained"))
    assert match_row(tmp_path / "kept", elsewhere, "gv_topk_100") == []
    main(["match", str(tmp_path / "kept"), str(elsewhere), "--row", "gv_topk_100"])
    assert "gv_topk_100 gives" in capsys.readouterr().out
    steps = elsewhere / "systems" / "gv_topk_100" / "steps.jsonl"
    records = [json.loads(x) for x in steps.read_text().splitlines()]
    evaluated = next(r for r in records if "eval/top1" in r and r["step"] < len(records))
    evaluated["eval/top1"] += 0.01
    steps.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert match_row(tmp_path / "kept", elsewhere, "gv_topk_100") == ["evals"]
    records[-1]["loss"] *= 1.5
    steps.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "final_loss" in match_row(tmp_path / "kept", elsewhere, "gv_topk_100")
    with pytest.raises(SystemExit, match="differs from .* row in final_loss"):
        main(["match", str(tmp_path / "kept"), str(elsewhere), "--row", "gv_topk_100"])
    with pytest.raises(SystemExit, match="holds no row 'gv_qsgd8'; its rows: 'ds_dense', 'gv_topk_100'"):
        match_row(tmp_path / "kept", elsewhere, "gv_qsgd8")
    with pytest.raises(SystemExit, match="holds no run of gv_topk_100"):
        match_row(tmp_path / "kept", tmp_path / "kept", "gv_topk_100")
