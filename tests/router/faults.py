"""Fault helpers for the router tests: wait for a condition, SIGKILL an engine."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from tests.support.sim_procs import SimProc


def eventually(check: Callable[[], bool], within: float = 15) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def kill(sim: SimProc) -> None:
    if sim.proc.poll() is None:
        os.killpg(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait(timeout=10)
