"""After the legs (and the report): the deployment put back as the bench found it, running (redeployed with the
topology's own settings) or stopped (taken down), and the state it was left in said in one line with the command
that changes it.

A Ctrl-C during the redeploy, or one more than the Ctrl-C that stopped the bench, takes the whole deployment down
instead: a known state, reached at once. A Ctrl-C while it goes down is said and waited out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pdctl.errors import PdctlError
from pdctl.lifecycle.hosts.interrupts import Interrupts
from pdctl.plan import ProcessSpec
from pdctl.topology import Topology


class Deployer(Protocol):
    """What the bench needs from the lifecycle: start a whole deployment from scratch, and stop it."""

    def redeploy(self, topo: Topology) -> list[ProcessSpec]:
        """Start `topo` from scratch; the plan it started (the leg's endpoints come from it)."""

    def down(self, topo: Topology) -> None: ...


@dataclass(frozen=True)
class Restored:
    """Where the bench left the deployment: `as found` (running or stopped, as it was), `down` (it ran before)
    or `unknown` (the restore failed); `line` says so with the command that changes it."""

    state: Literal["as found", "down", "unknown"]
    line: str


def restore(base: Topology, file: Path, was_running: bool, deployer: Deployer, ctrl_c: Interrupts,
            say: Callable[[str], None], stop_now: bool) -> Restored:
    """Put `base` back as found; `stop_now` (a Ctrl-C asked to stop after the bench's own): take it down instead."""
    up_again = f"`pdctl up -t {file}` starts it again"
    if was_running and not stop_now:
        say(f"restoring {base.name} as it was found (running); Ctrl-C takes it down instead")
        try:
            with ctrl_c.stops(then=f"taking {base.name} down",
                              said=f"interrupt received: stopping the restore; taking all of {base.name} down"):
                deployer.redeploy(base)
            return Restored("as found", f"{base.name} restored: running as it was found")
        except KeyboardInterrupt:
            pass
        except PdctlError as exc:
            say(f"restoring {base.name} failed: {exc.message.splitlines()[0]}; taking it down")
    elif was_running:
        say(f"not restoring {base.name} (Ctrl-C again): taking all of it down")
    else:
        say(f"restoring {base.name} as it was found (stopped): taking it down")
    try:
        with ctrl_c.finishing(f"taking {base.name} down (so nothing of it is left half up)"):
            deployer.down(base)
    except PdctlError as exc:
        return Restored("unknown", f"{base.name} may be partly up ({exc.message.splitlines()[0]}): "
                                   f"`pdctl down -t {file}` stops what is left, `pdctl status -t {file}` shows it")
    if not was_running:
        return Restored("as found", f"{base.name} left as it was found: down")
    return Restored("down", f"{base.name} is down (it was running before the bench): {up_again}")
