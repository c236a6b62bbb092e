"""Unlink DeepSpeed's shared-memory all-reduce buffer once every rank has mapped it.

DeepSpeed 0.19.8's CPU comm op (``deepspeed/ops/csrc/cpu/comm/shm.cpp``) creates
``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`` (~69 MB each) on every run
whose ranks are all on one machine, and never unlinks it: each run on a new port leaves 69 MB per rank of
RAM-backed tmpfs behind until reboot (our test suite alone filled a 24 GiB box and the OOM killer ended it).
Every rank maps all peers' buffers before ``deepspeed.comm`` finishes initializing, so after any collective that
all ranks joined the names are no longer needed: the mappings stay valid and the memory is freed at exit.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

logger = logging.getLogger("ds_gravac")
SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"


def buffer_path(addr: str, port: int | str, rank: int) -> Path:
    """The name DeepSpeed gives the buffer of ``rank`` in a job rendezvousing at ``addr:port``."""
    return SHM_DIR / f"{PREFIX}_{os.getuid()}_{addr}_{port}_{rank}"


def shm_buffer_path(rank: int) -> Optional[Path]:
    """This process's buffer (from its rendezvous environment), or None without a rendezvous address."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or not hasattr(os, "getuid"):
        return None
    return buffer_path(addr, port, rank)


def release_shm_buffer(rank: int) -> bool:
    """Unlink this rank's buffer name if it exists. Call only after a collective all ranks joined."""
    path = shm_buffer_path(rank)
    if path is None:
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False                      # GPU/NCCL, multi-node, or DeepSpeed stopped leaking it
    except OSError as exc:
        logger.debug("ds_gravac: could not unlink %s: %s", path, exc)
        return False
    return True
