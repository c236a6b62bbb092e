"""``netns.stop_groups`` ends a *stopped* process group with SIGTERM, as it does a running one.

A hung peer in the fault tests is a SIGSTOPped rank; a stopped process acts on SIGTERM only once continued, so
without a SIGCONT it would sit out the whole grace period and be SIGKILLed, its handlers never run.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ds_gravac_bench import netns

CHILD = """
import signal, sys, time
def on_term(signum, frame):
    open(sys.argv[1], "w").write("terminated")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[2], "w").write("ready")
while True:
    time.sleep(0.05)
"""


def test_a_stopped_group_gets_sigterm_not_the_sigkill_fallback(tmp_path: Path) -> None:
    marker, ready = tmp_path / "terminated", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), str(ready)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "child never started"
        os.kill(proc.pid, signal.SIGSTOP)
        netns.stop_groups([(proc.pid, netns.proc_starttime(proc.pid))], grace=3.0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert marker.exists(), "the stopped process was SIGKILLed without ever seeing SIGTERM"
