"""Rendezvous ports come from below the kernel's ephemeral range, where no outgoing connection can take them
between the choice and the bind (CI saw EADDRINUSE on a launcher's port chosen by ``bind(0)``)."""
from __future__ import annotations

import socket

from ds_gravac.integration.ports import LOWEST, ephemeral_range, free_port


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    assert 0 < low <= high
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST <= p < low for p in ports), ports
    assert len(ports) > 1                                   # drawn at random, not one fixed port for every caller
    for p in ports:
        with socket.socket() as s:
            s.bind(("", p))                                 # nobody listens there


def test_a_listening_port_is_never_returned() -> None:
    low, _ = ephemeral_range()
    listeners = []
    try:
        for port in range(LOWEST, min(LOWEST + 200, low)):     # occupy a block; draws that hit it must be skipped
            s = socket.socket()
            try:
                s.bind(("", port))
                s.listen()
                listeners.append(s)
            except OSError:
                s.close()
        taken = {s.getsockname()[1] for s in listeners}
        assert all(free_port() not in taken for _ in range(200))
    finally:
        for s in listeners:
            s.close()
