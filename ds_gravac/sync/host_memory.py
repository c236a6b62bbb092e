"""Give freed host memory back to the operating system after the codec dropped buffers it no longer needs.

Dropping a level's payload buffers (the controller stopped sending or probing it) frees them, but glibc keeps
freed blocks in its heap once its adaptive mmap threshold has grown past their size, so the process's resident
memory stays at its peak and creeps up with every switch of level. ``malloc_trim`` returns that memory. It runs
only on steps that dropped CPU buffers (level switches), and is a no-op where glibc is not the allocator.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache
from typing import Any, Optional


@lru_cache(maxsize=1)
def _libc() -> Optional[Any]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_freed_host_memory() -> bool:
    """``malloc_trim(0)``; True when glibc released something."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
