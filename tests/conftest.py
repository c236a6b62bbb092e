"""Suite-wide hygiene: DeepSpeed's CPU comm op leaves a ~69 MB /dev/shm buffer per rank for every single-node
launch on a new port (ds_gravac/integration/shm_buffer.py). Launches that fail before ``ds_gravac.attach``
releases the name would fill the RAM-backed tmpfs over a full suite, so after each test the buffers it created
and no live process maps are removed. Under xdist (``make test``) another worker's launch may be creating its buffers
right then (created by ``shm_open``, mapped a moment later): only buffers older than ``MIN_AGE_S`` are removed, and
a younger leak is caught by a later test or at the end of the session."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

SHM_DIR = Path("/dev/shm")
PATTERN = "deepspeed_allreduce_buffer_*"
MIN_AGE_S = 5.0     # far longer than a rank takes from creating its buffer to mapping it


def _mapped_names() -> set[str]:
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            names.update(line.rsplit("/", 1)[-1].split(" ")[0] for line in maps.read_text().splitlines()
                         if "deepspeed_allreduce_buffer" in line)
        except OSError:
            continue
    return names


def _old(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > MIN_AGE_S
    except OSError:
        return False


def _remove_unmapped(before: set[str]) -> None:
    new = [p for p in SHM_DIR.glob(PATTERN) if p.name not in before and _old(p)]
    if new:
        mapped = _mapped_names()
        for path in new:
            if path.name not in mapped:
                path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _remove_leaked_shm_buffers() -> Iterator[None]:
    before = {p.name for p in SHM_DIR.glob(PATTERN)}
    yield
    _remove_unmapped(before)


@pytest.fixture(autouse=True, scope="session")
def _remove_late_shm_buffers() -> Iterator[None]:
    """A rank that outlives its test (still exiting when the test's check ran) kept its buffer mapped then; at the
    end of the session every buffer the suite created and nothing maps any more goes."""
    before = {p.name for p in SHM_DIR.glob(PATTERN)}
    yield
    _remove_unmapped(before)


# Whole files go to the xdist workers (``--dist loadfile``) in collection order (``--no-loadscope-reorder``, set by
# the Makefile): the launcher files, a few tests of 20-150 s each, go first, so the short unit tests fill the gaps at
# the end. xdist's default order (most tests first) left them last, one worker running them alone for minutes.
FILE_ORDER = ("launcher", "hf", "distributed", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        folder = item.path.parent.name
        return FILE_ORDER.index(folder) if folder in FILE_ORDER else len(FILE_ORDER)

    items.sort(key=rank)      # stable: each file's tests keep their order
