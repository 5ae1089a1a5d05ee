"""The constrained string types of the topology schema: every value that can reach a shell on a host.

Commands quote these values too; the patterns are the first wall, so that a value such as
`efa.installer_version: "1.47.0;touch /tmp/x"` or an env key `-S sh -c ...` is refused by `pdctl validate`
with its line, before anything is planned.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator


def _pattern(regex: str, what: str) -> Callable[[str], str]:
    compiled = re.compile(regex)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {what}")
        return value

    return check


def _pep440(value: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise ValueError("must be a PEP 440 version like 0.33.0") from None
    if not re.fullmatch(r"[0-9A-Za-z.+!_-]+", value):
        raise ValueError("must be a PEP 440 version like 0.33.0")
    return value


def _requirement(value: str) -> str:
    try:
        Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"must be a pip requirement like `flashinfer-python==0.2.5` ({exc})") from None
    if "\x00" in value or "\n" in value:
        raise ValueError("must be a pip requirement on one line")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


ENV_KEY = r"[A-Za-z_][A-Za-z0-9_]*"

EnvKey = Annotated[
    str, AfterValidator(_pattern(ENV_KEY, "an environment variable name matching ^[A-Za-z_][A-Za-z0-9_]*$"))
]
"""A name that `env`, `export` and `systemd-run --setenv` all take as a name, never as an option."""

Text = Annotated[str, AfterValidator(_no_nul)]
"""A free-form value (env values, extra arguments): passed quoted, as one argument."""

DottedVersion = Annotated[str, AfterValidator(_pattern(r"[0-9]+(\.[0-9]+){0,3}", "a version like 1.47.0"))]
PackageVersion = Annotated[str, AfterValidator(_pep440)]
PipRequirement = Annotated[str, AfterValidator(_requirement)]
Sha256 = Annotated[str, AfterValidator(_pattern(r"[0-9a-fA-F]{64}", "64 hex digits (a sha256)"))]
HostPath = Annotated[
    str,
    AfterValidator(_pattern(r"(?!-)[\w./~+@:,= -]+", "a path of letters, digits, spaces and ./~+@:,=- "
                            "(no shell characters, not starting with -)")),
]
InstallerSource = Annotated[
    str,
    AfterValidator(_pattern(r"(?!-)[\w./~+@:,=%?&#-]+", "a URL or a path without spaces or shell characters")),
]
NodeName = Annotated[
    str, AfterValidator(_pattern(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", "letters, digits and ._- (at most 63)"))
]
Address = Annotated[
    str, AfterValidator(_pattern(r"(?!-)[A-Za-z0-9._:%\[\]-]{1,253}", "a hostname or an IP address"))
]
UserName = Annotated[str, AfterValidator(_pattern(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?", "a POSIX user name"))]
SshAlias = Annotated[
    str, AfterValidator(_pattern(r"(?!-)[\w.@:%+-]{1,253}", "a Host alias of ~/.ssh/config (no spaces)"))
]
ModelId = Annotated[
    str,
    AfterValidator(_pattern(r"[\w][\w.+-]*(/[\w.+-]+)?", "a Hugging Face id like Qwen/Qwen3-32B")),
]
GitRef = Annotated[str, AfterValidator(_pattern(r"(?!-)[\w./+-]{1,255}", "a commit hash, tag or branch"))]
ServedName = Annotated[
    str, AfterValidator(_pattern(r"[\w][\w.:/+-]{0,254}", "letters, digits and .:/+-_ (the name clients send)"))
]
Word = Annotated[str, AfterValidator(_pattern(r"[\w-]{1,64}", "letters, digits, _ and -"))]
SlurmName = Annotated[
    str, AfterValidator(_pattern(r"(?!-)[\w.:,=+\[\]-]{1,255}", "a Slurm name (letters, digits and ._:,=+[]-)"))
]
SlurmTime = Annotated[
    str, AfterValidator(_pattern(r"[0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|INFINITE",
                                 "a Slurm time like 30, 04:00:00 or 1-00:00:00"))
]
