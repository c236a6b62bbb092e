"""``long_keep match``: whether a run directory's dense run is a kept seed's curve bit for bit — the check that
this machine can continue that seed."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ds_gravac_bench.long_keep import main, match, restore

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
