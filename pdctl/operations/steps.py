"""Carry out the steps operations yield: run a script, upload a file with a progress bar, reboot and wait."""

from __future__ import annotations

import contextlib
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from pdctl.errors import PdctlError, RemoteCommandError
from pdctl.facts.base import gather
from pdctl.facts.host import BootId, Sudo
from pdctl.operations.base import Context, Put, Reboot, Run, Step
from pdctl.remote.base import CommandResult, Transport

REBOOT_TIMEOUT = 900.0
REBOOT_POLL = 2.0


class StepRunner:
    """Executes steps on hosts; one shared progress display for every upload, from any thread."""

    def __init__(self, console: Console, reboot_timeout: float = REBOOT_TIMEOUT) -> None:
        self.console = console
        self.reboot_timeout = reboot_timeout
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=console,
            transient=True,
        )

    def __enter__(self) -> StepRunner:
        self.progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def execute(self, step: Step, transport: Transport, ctx: Context) -> CommandResult | None:
        if isinstance(step, Run):
            return self.run(step, transport, ctx)
        if isinstance(step, Put):
            self.put(step, transport, ctx)
            return None
        if isinstance(step, Reboot):
            self.reboot(transport, ctx)
            return None
        return None

    def run(self, step: Run, transport: Transport, ctx: Context) -> CommandResult:
        sudo = step.admin and not ctx.facts.get(Sudo()).root
        script = ctx.layout.prologue() + step.command
        result = transport.run(script, sudo=sudo, timeout=step.timeout)
        if step.check and not result.ok:
            tail = "\n".join((result.stderr or result.stdout).splitlines()[-15:])
            raise RemoteCommandError(transport.name, step.describe, result.exit_code, tail)
        return result

    def put(self, step: Put, transport: Transport, ctx: Context) -> None:
        size = step.local.stat().st_size
        task = self.progress.add_task(f"{ctx.node.name}: {step.local.name}", total=size)
        try:
            transport.put(step.local, step.remote, lambda done, total: self.progress.update(task, completed=done))
        finally:
            self.progress.remove_task(task)

    def reboot(self, transport: Transport, ctx: Context) -> None:
        before = gather(transport, [BootId()], ctx.layout)[BootId().key()]
        sudo = not ctx.facts.get(Sudo()).root
        with contextlib.suppress(PdctlError):  # the connection drops while the host goes down
            transport.run(ctx.layout.prologue() + "reboot", sudo=sudo, timeout=30)
        transport.close()
        deadline = time.monotonic() + self.reboot_timeout
        while time.monotonic() < deadline:
            try:
                now = gather(transport, [BootId()], ctx.layout)[BootId().key()]
            except PdctlError:
                now = ""
            if now and now != before:
                self.console.print(f"  {ctx.node.name}: back after reboot", highlight=False)
                return
            time.sleep(REBOOT_POLL)
        raise PdctlError(
            f"{ctx.node.name}: did not come back within {self.reboot_timeout:.0f} s of a reboot",
            hint="check the node in the cloud console; rerun `pdctl up` once it answers SSH",
        )
