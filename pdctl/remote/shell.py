"""Commands as shell text: an argv list is quoted with `shlex`; a `str` is a script run by `sh -c` as it is."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

Command = str | Sequence[str]


def render(command: Command, env: Mapping[str, str] | None = None, sudo: bool = False) -> str:
    """One shell line for `command`; a leading `~/` in argv items becomes `"$HOME"/`."""
    script = command if isinstance(command, str) else " ".join(expand_home(a) for a in command)
    if env:
        exports = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        script = f"export {exports}; {script}"
    if sudo:
        script = f"sudo -n sh -c {shlex.quote(script)}"
    return script


def expand_home(arg: str) -> str:
    """Quote one argument for a POSIX shell, letting a leading `~/` expand to the remote user's home."""
    if arg == "~":
        return '"$HOME"'
    if arg.startswith("~/"):
        return '"$HOME"/' + shlex.quote(arg[2:])
    return shlex.quote(arg)
