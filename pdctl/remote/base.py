"""The one interface every host is reached through: run a command, move a file, read a file.

`local.LocalTransport`, `ssh.SshTransport` and `pdctl.slurm.transport.SlurmTransport` implement it; everything that
touches a host (facts, operations, launch) takes a `Transport` and never knows which one it has. Commands are data
(`shell.Command`): an argv list is quoted before it reaches a shell; a `str` is a shell script run by `sh -c`.
"""

from __future__ import annotations

import os
import shlex
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from pdctl.errors import RemoteCommandError
from pdctl.remote.procs import (
    DetachedJob,
    HostProcess,
    Started,
    kill_script,
    marker_script,
    parse_ps,
    parse_started,
    start_script,
)
from pdctl.remote.shell import Command, expand_home, render
from pdctl.secret import scrub, secret_values

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while a file moves."""


class Stream(Protocol):
    """What `connect_tcp` returns: a socket or an SSH channel."""

    def recv(self, size: int, /) -> bytes: ...

    def sendall(self, data: bytes, /) -> Any: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def lines(self) -> list[str]:
        return self.stdout.splitlines()


class Transport(ABC):
    """A connection to one host. Implementations are safe to use from one thread at a time per call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._http: httpx.BaseTransport | None = None

    def http(self) -> httpx.BaseTransport:
        """The httpx transport for HTTP to this host's addresses, pooled and shared: pass it as
        `httpx.Client(transport=...)`; closing that client leaves the pool open (it closes with the host)."""
        from pdctl.remote.sshhttp import Shared

        if self._http is None:
            self._http = self._new_http()
        return Shared(self._http)

    def async_http(self) -> httpx.AsyncBaseTransport:
        """A new async httpx transport reaching this host's addresses (one per event loop; the client closes it)."""
        return httpx.AsyncHTTPTransport()

    def _new_http(self) -> httpx.BaseTransport:
        return httpx.HTTPTransport()

    def connect_tcp(self, host: str, port: int, timeout: float = 10.0) -> Stream:
        """A byte stream to `host:port` as this host sees the network (a socket here, an SSH channel there)."""
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.settimeout(None)
        return sock

    def run(
        self,
        command: Command,
        *,
        env: Mapping[str, str] | None = None,
        sudo: bool = False,
        timeout: float | None = 60.0,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run a command to completion and return its result; never raises for a non-zero exit."""
        script = render(command, env, sudo and self._needs_sudo())
        return self._run_script(script, sudo=sudo, timeout=timeout, stdin=stdin or b"")

    def _needs_sudo(self) -> bool:
        """Whether `sudo=True` must prefix `sudo`: not where the command runs as root already."""
        return os.geteuid() != 0

    @abstractmethod
    def _run_script(self, script: str, *, sudo: bool, timeout: float | None, stdin: bytes) -> CommandResult:
        """Run the rendered `sh` script (env and sudo already in it) to completion; a timeout raises
        `RemoteCommandError` with exit status 124."""

    @abstractmethod
    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """Copy a local file to `remote` (parent directories created; `~/` allowed)."""

    def check(self, command: Command, **kwargs: object) -> CommandResult:
        """Run and raise `RemoteCommandError` (host, command, exit code, stderr tail) on a non-zero exit."""
        result = self.run(command, **kwargs)  # type: ignore[arg-type]
        if not result.ok:
            shown = command if isinstance(command, str) else shlex.join(command)
            tail = "\n".join((result.stderr or result.stdout).splitlines()[-15:])
            raise RemoteCommandError(self.name, shown, result.exit_code, tail)
        return result

    def read_text(self, path: str, max_bytes: int = 1 << 20) -> str | None:
        """The end of a text file, or None when it does not exist."""
        res = self.run(f"test -f {expand_home(path)} && tail -c {max_bytes} {expand_home(path)}")
        return res.stdout if res.ok else None

    def tail(self, path: str, lines: int = 20) -> str:
        res = self.run(f"tail -n {lines} {expand_home(path)} 2>/dev/null")
        return res.stdout

    def start_detached(self, job: DetachedJob) -> Started:
        """Start a long-running process that outlives this connection (systemd unit, else setsid)."""
        secrets = secret_values(job.env)
        try:
            res = self.check(start_script(job), timeout=60.0)
        except RemoteCommandError as exc:  # the error shows the script: never with its secrets
            raise RemoteCommandError(
                self.name, start_script(job, masked=True), exc.exit_status, scrub(exc.stderr_tail, secrets),
                scrub(exc.hint, secrets),
            ) from None
        return parse_started(res.stdout)

    def find_by_marker(self, deployment: str, node: str | None = None) -> list[HostProcess]:
        """Live processes whose environment says `PDCTL_DEPLOYMENT=<deployment>` (and `PDCTL_NODE=<node>`)."""
        procs = parse_ps(self.check(marker_script(deployment), timeout=60.0).stdout)
        return [p for p in procs if node is None or p.node == node]

    def signal(self, pids: Sequence[int], pgids: Sequence[int], signal: str = "TERM") -> None:
        """Send `signal` to processes and whole process groups; gone ones are ignored."""
        self.run(kill_script(list(pids), list(pgids), signal), timeout=30.0)

    def close(self) -> None:
        """Release the connection (and the HTTP pool)."""
        if self._http is not None:
            self._http.close()
            self._http = None
