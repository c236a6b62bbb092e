"""Rendezvous ports for processes started on one machine (the plan tool's one-rank group, launchers, tests)."""
from __future__ import annotations

import os
import random
import socket
import time

LOWEST = 20000      # below the kernel's ephemeral range, above the well-known and most registered service ports


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out for outgoing connections and ``bind(0)`` (Linux default 32768–60999)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nobody listens on now, chosen *below* the kernel's ephemeral range.

    Why not ``bind(0)``: that port comes from the ephemeral range, where every outgoing connection also takes its
    local port — gloo opens many between ranks. Between choosing a port and the rendezvous binding it (seconds,
    while the ranks import torch), another job's connection can take it: CI saw ``EADDRINUSE`` on a launcher's
    rendezvous port with two test workers running gloo groups beside it. Below the range only a listener can
    take it, and the draw is random, so concurrent callers rarely pick the same one."""
    low, _ = ephemeral_range()
    if low - LOWEST >= 1000:
        draw = random.Random(os.getpid() * 1_000_003 + time.monotonic_ns())
        for _ in range(100):
            port = draw.randrange(LOWEST, low)
            if _bindable(port):
                return port
    with socket.socket() as s:          # no room below the range (an unusual kernel setting): the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
