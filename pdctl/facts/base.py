"""Facts: read-only probes of a host, each a shell `command()` and a pure `process(lines)`.

A fact never changes a host. `gather()` runs many facts on one host in a single round trip (one shell script,
each fact's output fenced by markers), so probing a provisioned host over SSH costs one connection's latency.
Results are typed values (dataclasses or primitives) that pydantic turns into JSON and back, which the golden
tests and `pdctl doctor --json` use.
"""

from __future__ import annotations

import json
import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import TypeAdapter

from pdctl.errors import UsageError
from pdctl.remote.base import CommandResult, Transport
from pdctl.remote.shell import expand_home

T = TypeVar("T")

_ANY: TypeAdapter[Any] = TypeAdapter(Any)
FENCE = "@@pdctl-fact"
MISSING = "@@pdctl-missing-command"
LAYOUT_ENV = "PDCTL_HOST_LAYOUT"


class Fact(ABC, Generic[T]):
    """One probe. Subclasses set `name` (`module.Class`), `result` (the value's type) and `requires_command`."""

    name: ClassVar[str]
    result: ClassVar[Any]
    requires_command: ClassVar[str | None] = None

    @abstractmethod
    def command(self, layout: HostLayout) -> str:
        """The shell script that prints what `process` parses (stderr is merged into stdout)."""

    @abstractmethod
    def process(self, lines: list[str]) -> T:
        """Parse the script's output. Pure."""

    @abstractmethod
    def default(self) -> T:
        """The value when `requires_command` is not on the host."""

    def key(self) -> str:
        """Identity of this probe with its arguments (facts with equal keys are read once per host)."""
        args = getattr(self, "__dict__", {})
        return self.name + (json.dumps(args, sort_keys=True, default=str) if args else "")

    def to_json(self, value: T) -> Any:
        return _ANY.dump_python(value, mode="json")

    def from_json(self, data: Any) -> T:
        value: T = TypeAdapter(self.result).validate_python(data)
        return value


@dataclass(frozen=True)
class HostLayout:
    """Where a host keeps the things facts read, for hosts that are not laid out as the reference says.

    `root` prefixes the system paths facts read and write (`/opt/amazon`, `/sys/module`, the boot id), as a
    chroot or image build directory would; `path` is put in front of `PATH` for every command (tools that are
    not on a non-login shell's PATH); `env` is exported for every command.
    """

    root: str = ""
    path: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def sys(self, path: str) -> str:
        """A system path under `root`, quoted for the shell."""
        return shlex.quote(self.root.rstrip("/") + path)

    def prologue(self) -> str:
        parts = []
        if self.path:
            parts.append(f'export PATH={shlex.quote(":".join(self.path))}:"$PATH"')
        parts += [f"export {shlex.quote(f'{k}={v}')}" for k, v in self.env.items()]
        return "".join(p + "; " for p in parts)


def layouts_from_env(environ: Mapping[str, str] | None = None) -> dict[str, HostLayout]:
    """Per-node layouts from the JSON file named by $PDCTL_HOST_LAYOUT: `{"<node>" or "*": {root, path, env}}`."""
    source = (environ if environ is not None else os.environ).get(LAYOUT_ENV)
    if not source:
        return {}
    try:
        raw = json.loads(Path(source).read_text())
        return {
            node: HostLayout(
                root=str(spec.get("root", "")),
                path=tuple(spec.get("path", ())),
                env={str(k): str(v) for k, v in spec.get("env", {}).items()},
            )
            for node, spec in raw.items()
        }
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise UsageError(
            f"cannot read host layouts from {source} (${LAYOUT_ENV}): {exc}",
            hint='the file holds JSON like {"*": {"root": "", "path": ["/opt/amazon/efa/bin"], "env": {}}}',
        ) from None


def layout_for(layouts: Mapping[str, HostLayout], node: str) -> HostLayout:
    return layouts.get(node) or layouts.get("*") or HostLayout()


def path(p: str) -> str:
    """A host path for the shell: quoted, with a leading `~/` left to the remote shell."""
    return expand_home(p)


def fenced(index: int, fact: Fact[Any], layout: HostLayout) -> str:
    guard = ""
    if fact.requires_command:
        req = shlex.quote(fact.requires_command)
        guard = f"command -v {req} >/dev/null 2>&1 || {{ echo {MISSING}; exit 0; }}; "
    return (
        f"echo '{FENCE} {index}'; "
        f'out=$( ( {guard}{fact.command(layout)} ) 2>&1 ); '
        f'if [ -n "$out" ]; then printf "%s\\n" "$out"; fi; '
    )


def split(stdout: str, count: int) -> list[list[str] | None]:
    """The output lines of each fenced fact, in order; None for a fact whose output never came."""
    found: list[list[str] | None] = [None] * count
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(FENCE + " "):
            index = int(line.split()[1])
            current = found[index] = []
        elif current is not None:
            current.append(line)
    return found


def gather(transport: Transport, facts: Sequence[Fact[Any]], layout: HostLayout) -> dict[str, Any]:
    """Run `facts` on one host in one script; values keyed by `Fact.key()`."""
    script = layout.prologue() + "".join(fenced(i, f, layout) for i, f in enumerate(facts))
    result: CommandResult = transport.check(script, timeout=120)
    values: dict[str, Any] = {}
    for fact, lines in zip(facts, split(result.stdout, len(facts)), strict=True):
        if lines is None or lines == [MISSING]:
            values[fact.key()] = fact.default()
        else:
            values[fact.key()] = fact.process(lines)
    return values


def read(transport: Transport, fact: Fact[T], layout: HostLayout) -> T:
    """One fact on one host."""
    value: T = gather(transport, [fact], layout)[fact.key()]
    return value
