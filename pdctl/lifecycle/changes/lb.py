"""The load balancer in front of several routers (`router.replicas` > 1), from pdctl's side: check HAProxy is
there, write its configuration and reload it (master-worker: SIGUSR2 to the master), and drain / re-admit one
router through its admin socket (for a rolling restart of the routers). Everything goes through the router node's
transport, like the members file.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence

from pdctl.errors import LaunchError, RemoteCommandError
from pdctl.lb_config import BACKEND, Backend, haproxy_config
from pdctl.plan import ProcessSpec, lb_config_path, lb_socket_path, python_for
from pdctl.remote.base import Transport
from pdctl.remote.shell import expand_home
from pdctl.router.config import DEFAULT_HEADERS
from pdctl.state import ProcessRecord
from pdctl.topology import Topology

POLL_S = 0.2
RELOAD_TIMEOUT_S = 30.0
INSTALL_HINT = ("install HAProxy on that node (Debian/Ubuntu: `sudo apt-get install -y haproxy`), or point "
                "router.lb_binary at it")

_SOCKET_CLIENT = (
    "import socket,sys\n"
    "s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);s.sendall(sys.stdin.buffer.read()+b'\\n')\n"
    "out=b''\n"
    "while True:\n"
    "    b=s.recv(65536)\n"
    "    if not b: break\n"
    "    out+=b\n"
    "sys.stdout.write(out.decode('utf-8','replace'))\n"
)


def lb_spec(specs: Sequence[ProcessSpec]) -> ProcessSpec | None:
    return next((s for s in specs if s.role == "lb"), None)


def routers(specs: Sequence[ProcessSpec]) -> list[ProcessSpec]:
    return [s for s in specs if s.role == "router"]


def check_binary(topo: Topology, transport: Transport) -> None:
    """LaunchError with the fix where the node has no usable HAProxy (missing, not executable, too old)."""
    binary = topo.router.lb_binary
    res = transport.run(f"{expand_home(binary)} -v", timeout=30.0)
    if not res.ok:
        raise LaunchError(f"the load balancer {binary} does not run on {topo.router.node} "
                          f"(exit {res.exit_code}: {(res.stderr or res.stdout).strip()[:200]})", hint=INSTALL_HINT)
    words = res.stdout.split()
    version = words[2] if len(words) > 2 and words[0] == "HAProxy" else ""
    if tuple(int(x) for x in version.split("-")[0].split(".")[:2] if x.isdigit()) < (2, 6):
        raise LaunchError(f"{binary} on {topo.router.node} is {version or 'not HAProxy'}: pdctl needs HAProxy >= 2.6 "
                          "(it hashes on a variable: `balance hash`)", hint=INSTALL_HINT)


def _home(transport: Transport, path: str) -> str:
    if not path.startswith("~/"):
        return path
    return transport.check('printf %s "$HOME"', timeout=30.0).stdout.strip() + path[1:]


def config_text(topo: Topology, backends: Sequence[Backend], socket_path: str) -> str:
    node = topo.node(topo.router.node)
    headers = [h.lower() for h in (topo.router.conversation_headers or DEFAULT_HEADERS)]
    return haproxy_config(topo.router.bind or node.address, topo.router.port, backends, headers, socket_path)


def backends(specs: Sequence[ProcessSpec]) -> list[Backend]:
    return [Backend(s.name, s.host, s.ports[0]) for s in routers(specs)]


def wanted_config(topo: Topology, backends_: Sequence[Backend], transport: Transport) -> str:
    return config_text(topo, backends_, _home(transport, lb_socket_path(topo)))


def current_config(topo: Topology, transport: Transport) -> str | None:
    """The haproxy.cfg on the router's node now (what the running LB loaded), None where there is none."""
    return transport.read_text(lb_config_path(topo))


def write_config(topo: Topology, specs: Sequence[ProcessSpec], transport: Transport) -> None:
    install_config(topo, wanted_config(topo, backends(specs), transport), transport)


def install_config(topo: Topology, text: str, transport: Transport) -> None:
    """haproxy.cfg next to the members file (0600): written aside, checked with `haproxy -c` and only then moved
    in place. A config HAProxy refuses stops `up` here with HAProxy's own words, the running LB's file untouched."""
    target = expand_home(lb_config_path(topo))
    transport.check(f'mkdir -p "$(dirname {target})" && umask 077 && cat > {target}.new', stdin=text.encode(),
                    timeout=30.0)
    res = transport.run(f"{expand_home(topo.router.lb_binary)} -c -q -f {target}.new", timeout=30.0)
    if not res.ok:
        raise LaunchError(f"HAProxy refuses {lb_config_path(topo)} on {topo.router.node}: "
                          f"{(res.stderr or res.stdout).strip()[-400:]}", hint=INSTALL_HINT)
    transport.check(f"mv {target}.new {target}", timeout=30.0)


def worker_pid(topo: Topology, transport: Transport) -> int | None:
    """The pid of the HAProxy worker that answers the admin socket (`show info`), None where none answers."""
    try:
        out = command(topo, transport, "show info")
    except RemoteCommandError:
        return None
    for line in out.splitlines():
        if line.startswith("Pid:") and line[4:].strip().isdigit():
            return int(line[4:])
    return None


def reload(topo: Topology, transport: Transport, master: ProcessRecord, timeout: float = RELOAD_TIMEOUT_S) -> None:
    """SIGUSR2 to the master pdctl started (its recorded pid): it re-reads haproxy.cfg and forks a new worker;
    the old worker stops listening and finishes the connections it holds. Done once a new worker answers."""
    old = worker_pid(topo, transport)
    transport.signal([master.pid], [], "USR2")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = worker_pid(topo, transport)
        if now is not None and now != old:
            return
        time.sleep(POLL_S)
    raise LaunchError(f"the load balancer on {topo.router.node} did not reload {lb_config_path(topo)} within "
                      f"{timeout:g}s (its worker is still pid {old})",
                      hint=f"see its log (`pdctl logs -t {topo.file} lb`); `pdctl up` again retries")


def command(topo: Topology, transport: Transport, line: str) -> str:
    """One admin-socket command on the LB's node; its answer."""
    py = python_for(topo, node=topo.router.node)
    sock = expand_home(lb_socket_path(topo))
    res = transport.check(f"{shlex.quote(py)} -c {shlex.quote(_SOCKET_CLIENT)} {sock}", stdin=line.encode(),
                          timeout=30.0)
    return res.stdout


def set_state(topo: Topology, transport: Transport, router: str, state: str) -> None:
    """`ready`, `drain` (no new conversations, open requests finish) or `maint` for one router."""
    out = command(topo, transport, f"set server {BACKEND}/{router} state {state}")
    if out.strip():
        raise LaunchError(f"HAProxy did not set {router} to {state}: {out.strip()[:200]}",
                          hint="see its log (`pdctl logs -t <topology> lb`)")


def sessions(topo: Topology, transport: Transport, router: str) -> int | None:
    """Requests HAProxy has open on `router` now (`show stat`'s scur), None where it does not list it."""
    lines = command(topo, transport, "show stat").splitlines()
    if not lines or not lines[0].startswith("# "):
        return None
    head = lines[0][2:].split(",")
    for line in lines[1:]:
        row = dict(zip(head, line.split(","), strict=False))
        if row.get("pxname") == BACKEND and row.get("svname") == router:
            return int(row.get("scur") or 0)
    return None


def wait_idle(topo: Topology, transport: Transport, router: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left: int | None = None
    while time.monotonic() < deadline:
        left = sessions(topo, transport, router)
        if left == 0:
            return
        time.sleep(POLL_S)
    raise LaunchError(f"{router} still has {left} request(s) open through the load balancer after {timeout:g}s; "
                      "it is drained (no new conversations) and still running",
                      hint="`pdctl up --restart --rolling` again waits again; `--timeout <s>` waits longer")


def wait_state(topo: Topology, transport: Transport, router: str, want: str, timeout: float = 30.0) -> None:
    """Until HAProxy's health check has the router in `want` (UP) - so the next one is drained only then."""
    deadline = time.monotonic() + timeout
    status = "?"
    while time.monotonic() < deadline:
        for line in command(topo, transport, "show stat").splitlines()[1:]:
            cols = line.split(",")
            if len(cols) > 17 and cols[0] == BACKEND and cols[1] == router:
                status = cols[17]
        if status.startswith(want):
            return
        time.sleep(POLL_S)
    raise LaunchError(f"the load balancer sees {router} as {status}, not {want}, after {timeout:g}s",
                      hint="see `pdctl logs -t <topology> lb` and the router's log")
