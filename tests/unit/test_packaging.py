"""What `pip install ds_gravac` installs: the library alone, not the repository's example scripts or benchmark tools
(a top-level package named `runners` would shadow any user module of that name)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_only_the_library(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("ds_gravac", "runners", "ds_gravac_bench"):       # present, as in a checkout: must be left out
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    wheel, = (tmp_path / "dist").glob("ds_gravac-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"ds_gravac"}
