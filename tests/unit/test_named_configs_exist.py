"""Every config a document, script or Makefile names as ``ds_configs/<file>.json`` is in the repository: a user
who copies a command line from a docstring or a doc finds the file it names."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("*.md", "*.py", "*.sh", "Makefile", ".ci/run")
# a config path in text or code: stops at what cannot be in a file name (quotes, spaces, "@key=value" overrides);
# a pattern (ds_configs/<model>_dense.json, ds_configs/*.json) does not match
CONFIG_PATH = re.compile(r"(?<![\w/.-])ds_configs/[\w./-]*?\.json")
# the strings this file's sibling feeds its own path pattern (made-up names on purpose)
PATTERN_FIXTURES = {"tests/unit/test_repository_hygiene.py"}
OLD_TREE = re.compile(r"[0-9a-f]{7,40}:$")        # "921a7a5:ds_configs/x.json": a file of an older tree (git's syntax)


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SOURCES], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def named_configs(text: str) -> list[str]:
    """The config paths (under ds_configs/, ending in .json) a text names; patterns and older trees' files left out."""
    return [m.group(0) for m in CONFIG_PATH.finditer(text)
            if not OLD_TREE.search(text[max(0, m.start() - 41):m.start()])]


def test_the_pattern_finds_what_it_should() -> None:
    text = ("run `--deepspeed_config ds_configs/hf.json` or 'cfg:ds_configs/bench/lstm_gravac_exp.json@window=15', "
            "\"ds_configs/default.json\"; not ds_configs/<model>_dense.json, ds_configs/*_gravac.json, "
            "921a7a5:ds_configs/old.json nor my_ds_configs/x.json")
    assert named_configs(text) == ["ds_configs/hf.json", "ds_configs/bench/lstm_gravac_exp.json",
                                   "ds_configs/default.json"]


def test_every_config_a_tracked_file_names_exists() -> None:
    files = _tracked()
    assert any(p.name == "Makefile" for p in files) and any(p.suffix == ".py" for p in files)
    missing = []
    for path in files:
        if str(path.relative_to(ROOT)) in PATTERN_FIXTURES:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        missing += [f"{path.relative_to(ROOT)}: {name}" for name in named_configs(text) if not (ROOT / name).is_file()]
    assert not missing, f"named but not in the repository (fix the path, or the doc): {sorted(set(missing))}"
