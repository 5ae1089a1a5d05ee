"""The dry runner: an operation driven until its first change, which is recorded and not carried out.

Facts are read for real (they only read), so an operation decides exactly as it would under `StepRunner`. Its
first `Run`, `Put` or `Reboot` is what it would change; the generator is closed there, because every later step
may depend on that change having happened (a venv that exists, a module that is loaded). So a preview says
"no change" or "would <first change>", and more may follow the first change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdctl.errors import PdctlError
from pdctl.operations.base import Context, Noop, Operation


@dataclass(frozen=True)
class Preview:
    """One operation on one host, dry: the first change it would make, or why it makes none, or why it stops.

    `after_changes`: an earlier operation on the host would change it first, so this one decided on facts
    that will be different by the time it runs.
    """

    name: str
    would: str | None = None
    noop: str | None = None
    error: PdctlError | None = None
    after_changes: bool = False

    @property
    def changes(self) -> bool:
        return self.would is not None

    def describe(self) -> str:
        if self.would is not None:
            return f"would {self.would}"
        if self.error is not None:
            if self.after_changes:
                return "decided once the changes above are made"
            return f"would fail: {self.error.message.splitlines()[0]}"
        return f"no change ({self.noop})" if self.noop else "no change"


def dry_run(name: str, operation: Callable[[Context], Operation], ctx: Context) -> Preview:
    """Run `operation` on `ctx` until it yields its first change; nothing of that change is executed."""
    steps = operation(ctx)
    noop: str | None = None
    try:
        for step in steps:  # a Noop gets None back, as from StepRunner
            if not isinstance(step, Noop):
                return Preview(name, would=step.describe)
            noop = step.reason
    except PdctlError as exc:
        return Preview(name, error=exc)
    finally:
        steps.close()
    return Preview(name, noop=noop)
