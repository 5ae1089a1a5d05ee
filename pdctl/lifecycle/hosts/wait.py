"""Waiting for processes to serve, with a live per-process display (state, elapsed, last log line).

Stops at the first process that dies (its log tail goes into the error) or when the timeout passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pdctl.errors import LaunchError
from pdctl.lifecycle.hosts.launch import health, running
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.secret import scrub, secret_values

POLL_S = 0.5
LIVENESS_EVERY = 2
RECHECK_S = 0.5  # before a process missing from the host's list counts as exited
TAIL_LINES = 30

HealthCheck = Callable[[ProcessSpec, Transport], str]
"""`ok` or why not, for a spec and the transport of its node."""


@dataclass
class _Row:
    spec: ProcessSpec
    state: str = "starting"
    last_line: str = ""
    started: float = field(default_factory=time.monotonic)
    ready_after: float | None = None


def default_check(spec: ProcessSpec, transport: Transport) -> str:
    return health(transport, spec.health_url, timeout=2.0)


def wait_healthy(
    specs: Sequence[ProcessSpec],
    hosts: Mapping[str, Transport],
    deployment: str,
    console: Console,
    *,
    timeout: float,
    check: HealthCheck = default_check,
) -> dict[str, float]:
    """Block until every spec answers its health check; returns seconds to healthy by process name."""
    rows = {s.name: _Row(s) for s in specs}
    start = time.monotonic()
    polls = 0
    live_display = Live(_render(rows), console=console, transient=False, refresh_per_second=4)
    if not console.is_terminal:
        live_display = _Lines(console, rows)  # type: ignore[assignment]
    with live_display as live:
        while True:
            pending = [r for r in rows.values() if r.ready_after is None]
            if not pending:
                break
            for row in pending:
                verdict = check(row.spec, hosts[row.spec.node])
                if verdict == "ok":
                    row.state, row.ready_after = "healthy", time.monotonic() - row.started
                else:
                    row.state = f"waiting ({verdict})"
            if polls % LIVENESS_EVERY == 0:
                _liveness(rows, hosts, deployment)
            polls += 1
            live.update(_render(rows))
            if time.monotonic() - start > timeout:
                slow = [r.spec for r in rows.values() if r.ready_after is None]
                raise _not_ready(slow, hosts, timeout)
            if any(r.ready_after is None for r in rows.values()):
                time.sleep(POLL_S)
    return {n: r.ready_after or 0.0 for n, r in rows.items()}


def _liveness(rows: dict[str, _Row], hosts: Mapping[str, Transport], deployment: str) -> None:
    pending = [r for r in rows.values() if r.ready_after is None]
    nodes = sorted({r.spec.node for r in pending})
    alive = parallel(nodes, lambda n: running(hosts[n], deployment, n))
    if any(r.spec.name not in alive[r.spec.node] for r in pending):
        # Asked once more, a moment later: a process that re-executes itself is briefly unreadable in /proc
        # (HAProxy's master does, into its wait mode, right after it forks its worker).
        time.sleep(RECHECK_S)
        alive = parallel(nodes, lambda n: running(hosts[n], deployment, n))
    for row in pending:
        transport = hosts[row.spec.node]
        tail = scrub(transport.tail(row.spec.log_path, lines=TAIL_LINES), secret_values(row.spec.env))
        lines = [ln for ln in tail.splitlines() if ln.strip()]
        row.last_line = lines[-1] if lines else ""
        if row.spec.name not in alive[row.spec.node]:
            # It may have become healthy and exited in between; the health check decides first.
            raise LaunchError(
                f"{row.spec.name} on {row.spec.node} exited before it served "
                f"({row.spec.health_url}); last lines of {row.spec.log_path}:\n" + "\n".join(lines[-15:]),
                hint=f"see the whole log with `pdctl logs {row.spec.name}`; fix and rerun `pdctl up`",
            )


def _not_ready(specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport], timeout: float) -> LaunchError:
    parts = []
    for spec in specs:
        tail = scrub(hosts[spec.node].tail(spec.log_path, lines=8).rstrip(), secret_values(spec.env))
        parts.append(f"{spec.name} on {spec.node} ({spec.health_url}):\n{tail}")
    return LaunchError(
        f"not healthy after {timeout:g}s: " + "\n".join(parts),
        hint="raise the limit with `pdctl up --timeout SECONDS` (a large model loads for minutes), "
        "or read the logs with `pdctl logs <process>`",
    )


class _Lines:
    """Stand-in for `Live` where the console is not a terminal (logs, CI): one line per process when ready."""

    def __init__(self, console: Console, rows: dict[str, _Row]) -> None:
        self.console = console
        self.rows = rows
        self.said: set[str] = set()

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, _renderable: object) -> None:
        for row in self.rows.values():
            if row.ready_after is not None and row.spec.name not in self.said:
                self.said.add(row.spec.name)
                self.console.print(
                    f"{row.spec.name} on {row.spec.node}: healthy after {row.ready_after:.1f}s", highlight=False
                )


def _render(rows: dict[str, _Row]) -> Group:
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("process", "node", "state", "elapsed", "last log line"):
        table.add_column(col, overflow="ellipsis", no_wrap=True)
    now = time.monotonic()
    for row in rows.values():
        elapsed = row.ready_after if row.ready_after is not None else now - row.started
        style = "green" if row.ready_after is not None else "yellow"
        table.add_row(
            row.spec.name, row.spec.node, Text(row.state, style=style), f"{elapsed:5.1f}s",
            Text(row.last_line[-100:]),
        )
    return Group(table)
