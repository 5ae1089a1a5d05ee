"""pdctl's one exception tree.

    PdctlError                      exit code 1 unless stated
    ├── UsageError                  bad command-line input                 (exit 2)
    ├── TopologyError               the topology file is invalid           (exit 2)
    ├── ConnectError                a host could not be reached or logged into
    ├── RemoteCommandError          a command on a host failed
    ├── LaunchError                 a process did not start or serve
    ├── SmokeTestError              the deployment serves but KV reuse does not happen
    ├── StateError                  the deployment state file is missing or unreadable
    ├── BusyError                   another pdctl process is changing the same deployment
    └── SlurmError                  a Slurm command failed, or the deployment's job is not running

Every error carries a `hint`: the next thing the user can do. `pdctl/cli/errors.py` prints
`Error: <message>` and `hint: <hint>` to stderr and exits with `exit_code`.
Lower-layer errors (paramiko, socket, httpx) are translated into these at one boundary per layer.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

EXIT_RUNTIME = 1
EXIT_USAGE = 2


class PdctlError(Exception):
    """Base of every error pdctl reports to the user."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(PdctlError):
    """The command line asks for something that cannot be done."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a topology file, located at file:line and a dotted key."""

    path: str
    line: int | None
    key: str
    message: str
    hint: str = ""

    def render(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        text = f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


class TopologyError(PdctlError, ValueError):
    """The topology file is missing, unparsable or invalid; lists every problem found."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  {p.render()}" for p in problems)
        files = sorted({p.path for p in problems if not p.path.startswith("--set ")})
        hint = (f"fix the file and check it with `pdctl validate -t {shlex.quote(files[0])}`" if len(files) == 1 else
                "fix the file and check it with `pdctl validate -t <file>`" if files else
                "fix the --set value; `pdctl validate --set KEY=VALUE` checks it")
        super().__init__(f"invalid topology ({count}):\n{lines}", hint=hint)


class ConnectError(PdctlError):
    """A host could not be reached, authenticated to, or trusted."""

    def __init__(self, host: str, message: str, hint: str = "") -> None:
        super().__init__(f"{host}: {message}", hint)
        self.host = host


class RemoteCommandError(PdctlError):
    """A command run on a host exited non-zero."""

    def __init__(self, host: str, command: str, exit_code: int, stderr_tail: str, hint: str = "") -> None:
        tail = f"\n{stderr_tail.rstrip()}" if stderr_tail.strip() else ""
        super().__init__(f"{host}: `{command}` exited {exit_code}{tail}", hint)
        self.host = host
        self.command = command
        self.exit_status = exit_code
        self.stderr_tail = stderr_tail


class LaunchError(PdctlError):
    """A process of the deployment died or did not become healthy in time."""


class SmokeTestError(PdctlError):
    """The deployment answers but the second turn of a conversation did not reuse the decode's KV."""


class StateError(PdctlError):
    """The deployment state file is missing or cannot be read."""


class BusyError(PdctlError):
    """Another pdctl process holds the deployment's lock (two `up`s at once would both start processes)."""

    def __init__(self, message: str, holder_pid: int | None, hint: str = "") -> None:
        super().__init__(message, hint)
        self.holder_pid = holder_pid


class SlurmError(PdctlError):
    """A Slurm client command failed, or the deployment's job is missing or not running."""
