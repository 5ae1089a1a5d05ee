"""The dry runner on this machine (a real LocalTransport): facts are read for real, an operation stops at its
first change, which is not carried out, and StepRunner then makes exactly the changes the dry run named first."""

from __future__ import annotations

import io
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.console import Console

from pdctl.errors import PdctlError
from pdctl.facts.base import Fact, HostLayout, gather
from pdctl.lifecycle.bringup.provision import run_operation
from pdctl.operations.base import Context, Facts, Noop, Operation, Run
from pdctl.operations.dry import Preview, dry_run
from pdctl.operations.steps import StepRunner
from pdctl.remote.local import LocalTransport
from tests.provision.support import topology


@dataclass(frozen=True)
class FileText(Fact[str | None]):
    """The first line of a file, None when it does not exist."""

    file: str
    name: ClassVar[str] = "test.FileText"
    result: ClassVar[object] = str | None

    def command(self, layout: HostLayout) -> str:
        return f"cat {shlex.quote(self.file)} 2>/dev/null || echo @@absent"

    def process(self, lines: list[str]) -> str | None:
        return None if lines == ["@@absent"] else (lines[0] if lines else "")

    def default(self) -> str | None:
        return None


class TwoSteps:
    """Writes `first`, then a `marker` that says it is done; records how far it got and that it was closed."""

    def __init__(self, root: Path) -> None:
        self.first, self.marker = root / "first", root / "marker"
        self.reached: list[str] = []

    def __call__(self, ctx: Context) -> Operation:
        try:
            found = ctx.facts.get(FileText(str(self.marker)))
            if found == "done":
                yield Noop(f"{self.marker.name} says done")
                return
            self.reached.append("first")
            yield Run(f"echo one > {shlex.quote(str(self.first))}", f"write {self.first.name} (marker: {found})")
            self.reached.append("second")
            yield Run(f"echo done > {shlex.quote(str(self.marker))}", f"write {self.marker.name}")
        finally:
            self.reached.append("closed")


def _context(transport: LocalTransport) -> Context:
    topo = topology(engine="sim")
    return Context(topo=topo, node=topo.nodes[0],
                   facts=Facts(lambda facts: gather(transport, facts, HostLayout())))


def test_a_dry_run_stops_at_the_first_change_and_does_not_make_it(tmp_path: Path) -> None:
    transport = LocalTransport("a")
    op = TwoSteps(tmp_path)
    op.marker.write_text("pending\n")

    preview = dry_run("test.two", op, _context(transport))

    assert preview == Preview("test.two", would="write first (marker: pending)")  # the fact was read on the host
    assert preview.describe() == "would write first (marker: pending)"
    assert op.reached == ["first", "closed"]  # never past the first change, and the generator was closed
    assert not op.first.exists() and op.marker.read_text() == "pending\n"

    op.reached.clear()
    with StepRunner(Console(file=io.StringIO())) as runner:
        applied = run_operation("test.two", op, _context(transport), transport, runner.console, runner)
    assert applied.changes == ["write first (marker: pending)", "write marker"]
    assert op.first.read_text() == "one\n" and op.marker.read_text() == "done\n"

    again = dry_run("test.two", op, _context(transport))
    assert again == Preview("test.two", noop="marker says done")
    assert again.describe() == "no change (marker says done)"


def test_an_operation_that_refuses_is_reported_with_its_message(tmp_path: Path) -> None:
    def refuses(ctx: Context) -> Operation:
        yield Noop("looked")
        raise PdctlError(f"{ctx.node.name}: cannot do this here", hint="do it by hand")

    preview = dry_run("test.refuses", refuses, _context(LocalTransport("a")))
    assert preview.error is not None and preview.error.hint == "do it by hand"
    assert preview.describe() == "would fail: a: cannot do this here"
    assert not preview.changes
