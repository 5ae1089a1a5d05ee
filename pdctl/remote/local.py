"""The machine pdctl runs on, behind the same interface as an SSH host."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from pdctl.errors import RemoteCommandError
from pdctl.remote.base import CommandResult, Progress, Transport

CHUNK = 1 << 20


class LocalTransport(Transport):
    """Runs commands with `sh -c` in a subprocess; files are copied, not sent."""

    def __init__(self, name: str = "local") -> None:
        super().__init__(name)

    def _run_script(self, script: str, *, sudo: bool, timeout: float | None, stdin: bytes) -> CommandResult:
        start = time.monotonic()
        try:
            proc = subprocess.run(
                ["sh", "-c", script],
                input=stdin,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RemoteCommandError(
                self.name, script, 124, _text(exc.stderr), hint=f"it ran longer than {timeout:g}s"
            ) from None
        return CommandResult(
            proc.returncode, _text(proc.stdout), _text(proc.stderr), time.monotonic() - start
        )

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        dest = Path(os.path.expanduser(remote))
        dest.parent.mkdir(parents=True, exist_ok=True)
        total = local.stat().st_size
        done = 0
        tmp = dest.with_name(f".{dest.name}.pdctl-tmp")
        with local.open("rb") as src, tmp.open("wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        shutil.copymode(local, tmp)
        os.replace(tmp, dest)
        if progress and total == 0:
            progress(0, 0)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
