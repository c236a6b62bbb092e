"""Build DeepSpeed's shm comm op once, ahead of any launch.

``deepspeed.comm``'s torch backend JIT-compiles ``deepspeed_shm_comm`` on the first launch per
``TORCH_EXTENSIONS_DIR``. Inside a launch every rank pays for it at once: on 2 cores with ranks pinned by
``taskset`` the compile takes minutes while the other ranks wait on its lock, which looks like a hang. Building it
here, with all cores and before any rank starts, makes every later launch find a warm cache. Quick when warm.
"""
from __future__ import annotations

import os
import sys
import time


def warm_shm_comm_op() -> str:
    """Compile (or just load) the op into ``$TORCH_EXTENSIONS_DIR``; returns a one-line status."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return "shm comm op not used by this accelerator; nothing to build"
    start = time.perf_counter()
    builder.load(verbose=False)
    where = os.environ.get("TORCH_EXTENSIONS_DIR", "the default torch extensions dir")
    return f"shm comm op ready in {where} ({time.perf_counter() - start:.1f} s)"


if __name__ == "__main__":
    print(f"[warm_ops] {warm_shm_comm_op()}", file=sys.stderr)
