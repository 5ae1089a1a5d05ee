"""Operations: generators that read facts and yield the steps that bring a host to what the topology asks.

An operation yields `Noop(reason)` when its facts already agree, or the steps to take (`Run`, `Put`,
`Reboot`); the runner executes each step as it is yielded and sends back its `CommandResult`, so an operation
can look at what the installer printed. Facts an operation changed are `forget()`-ten and re-read on next use.
Golden tests drive operations with facts given as JSON and canned results, without a host.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pdctl.facts.base import Fact, HostLayout
from pdctl.remote.base import CommandResult
from pdctl.topology import Node, Topology

T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    """A shell script to run on the host; `admin` ones run as root (sudo unless already root)."""

    command: str
    describe: str
    admin: bool = False
    timeout: float | None = 600.0
    check: bool = True


@dataclass(frozen=True)
class Put:
    """Copy a file from the CLI's machine to the host, with a progress bar."""

    local: Path
    remote: str
    describe: str


@dataclass(frozen=True)
class Reboot:
    """Reboot the host and wait until it answers again with a new boot id."""

    describe: str


@dataclass(frozen=True)
class Noop:
    """Nothing to do: the facts already agree. `reason` says what was found."""

    reason: str


Step = Run | Put | Reboot | Noop
Operation = Generator[Step, CommandResult | None, None]


class Facts:
    """A host's facts, read on first use through `reader` and cached until an operation forgets them."""

    def __init__(self, reader: Callable[[list[Fact[Any]]], dict[str, Any]]) -> None:
        self._reader = reader
        self._values: dict[str, Any] = {}

    def get(self, fact: Fact[T]) -> T:
        key = fact.key()
        if key not in self._values:
            self._values.update(self._reader([fact]))
        value: T = self._values[key]
        return value

    def prime(self, values: dict[str, Any]) -> None:
        self._values.update(values)

    def forget(self, *facts: Fact[Any]) -> None:
        """Drop these facts, and every other reading of the same kinds (same `name`, other arguments)."""
        names = {f.name for f in facts}
        for key in [k for k in self._values if any(k == n or k.startswith(n + "{") for n in names)]:
            del self._values[key]


@dataclass
class Context:
    """What an operation may read: the topology, its node, the node's facts and layout, and the run's options."""

    topo: Topology
    node: Node
    facts: Facts
    layout: HostLayout = field(default_factory=HostLayout)
    runs_engine: bool = False
    runs_pdctl: bool = False
    allow_reboot: bool = False
    wheel: Any = None  # ship.Wheel when pdctl ships itself this run
    wheelhouse: list[Path] = field(default_factory=list)

    @property
    def venv(self) -> str | None:
        """This node's venv (nodes[].venv, else python.venv); None: the CLI's own interpreter."""
        return self.topo.venv_for(self.node.name)

    @property
    def python(self) -> str:
        """The node's interpreter for pdctl's and vLLM's packages: the venv's, or the CLI's own."""
        return f"{self.venv}/bin/python" if self.venv else sys.executable

    @property
    def venv_dir(self) -> str:
        return self.venv or str(Path(sys.executable).parent.parent)

    @property
    def work_dir(self) -> str:
        """This node's work directory (nodes[].work_dir, else work_dir): uploads are staged under it."""
        return self.topo.work_dir_for(self.node.name)

    @property
    def remote_wheelhouse(self) -> str:
        return f"{self.work_dir}/wheelhouse"

    @property
    def vllm(self) -> bool:
        return self.topo.engine == "vllm" and self.runs_engine
