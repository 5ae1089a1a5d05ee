"""`pdctl logs` as a library call: the last lines of one process's log (or of every process's), and with
`follow` the lines written after them, until `stop` is set.

    logs(topo, sink, process="router", lines=50, follow=True, ssh=..., stop=event)
"""

from __future__ import annotations

import threading
from typing import Protocol

from pdctl.errors import UsageError
from pdctl.lifecycle.hosts.connect import connected
from pdctl.plan import ProcessSpec, plan
from pdctl.remote.base import Transport
from pdctl.remote.shell import expand_home
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology

FOLLOW_POLL_S = 1.0


class LogSink(Protocol):
    """Where the log text goes; `section` comes before each log when there are several."""

    def section(self, spec: ProcessSpec) -> None: ...

    def write(self, text: str) -> None: ...


def logs(
    topo: Topology,
    sink: LogSink,
    *,
    process: str | None = None,
    lines: int = 50,
    follow: bool = False,
    ssh: SshOptions | None = None,
    stop: threading.Event | None = None,
    poll_s: float = FOLLOW_POLL_S,
) -> None:
    """Write the end of the chosen logs to `sink`; `follow` (one process only) keeps writing new text."""
    from pdctl.slurm.allocation import bound

    topo = bound(topo)
    specs = plan(topo)
    chosen = [s for s in specs if process is None or s.name == process]
    if not chosen:
        names = ", ".join(s.name for s in specs)
        raise UsageError(f"no process {process!r} in {topo.name}", hint=f"choose one of: {names}")
    if follow and len(chosen) > 1:
        names = ", ".join(s.name for s in specs)
        raise UsageError("--follow follows one process's log: name it",
                         hint=f"e.g. `pdctl logs -t {topo.file} {specs[0].name} -f`; the processes: {names}")
    with connected(topo.nodes, ssh) as hosts:
        if follow:
            follow_log(hosts[chosen[0].node], chosen[0].log_path, lines, sink, stop or threading.Event(), poll_s)
            return
        for spec in chosen:
            if len(chosen) > 1:
                sink.section(spec)
            sink.write(hosts[spec.node].tail(spec.log_path, lines=lines))


def follow_log(transport: Transport, path: str, lines: int, sink: LogSink, stop: threading.Event,
               poll_s: float) -> None:
    """The last `lines` of `path`, then what is appended to it, every `poll_s`, until `stop` is set.
    The tail is cut at the size read first, so nothing written meanwhile is lost or written twice."""
    quoted = expand_home(path)
    size = int(transport.run(f"wc -c < {quoted} 2>/dev/null || echo 0").stdout.strip() or 0)
    sink.write(transport.run(f"head -c {size} {quoted} 2>/dev/null | tail -n {lines}").stdout)
    while not stop.wait(poll_s):
        res = transport.run(f"tail -c +{size + 1} {quoted} 2>/dev/null")
        if res.stdout:
            sink.write(res.stdout)
            size += len(res.stdout.encode())
