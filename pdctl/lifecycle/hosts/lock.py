"""One `up` or `down` at a time per deployment, across processes: an fcntl lock next to the state file.

The lock is `flock` on `$PDCTL_HOME/deployments/<name>.lock`, so it dies with its holder (a killed `up` leaves
no stale lock); the file keeps the holder's pid and action for the message the loser prints.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pdctl.errors import BusyError
from pdctl.state import state_path

READ_TRIES = 20
READ_PAUSE_S = 0.025


def lock_path(name: str) -> Path:
    return state_path(name).with_suffix(".lock")


@contextmanager
def deployment_lock(name: str, action: str) -> Iterator[None]:
    """Hold `name`'s lock for the block; raise BusyError at once when another process holds it."""
    path = lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, what = _holder(fd)
            who = f"pdctl {what} (pid {pid})" if pid else "another pdctl process"
            raise BusyError(
                f"{name}: {who} is already working on this deployment; this {action} changed nothing",
                holder_pid=pid,
                hint=f"wait for it to finish, or stop it{f' (kill {pid})' if pid else ''}; the lock is {path}",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {action}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> tuple[int | None, str]:
    """The holder's pid and action; it writes them just after taking the lock, so give it a moment."""
    for _ in range(READ_TRIES):
        words = os.pread(fd, 200, 0).decode(errors="replace").split()
        if len(words) >= 2 and words[0].isdigit():
            return int(words[0]), words[1]
        time.sleep(READ_PAUSE_S)
    return None, ""
