"""`status`'s line on how to reach the router: a port-forward for a router on another machine, the router's own URL
when it listens on this one (local transport, an address of this machine, or SSH to this machine)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pdctl.lifecycle.watch.status import reach_hint
from pdctl.plan import entry, plan
from pdctl.remote.base import Transport
from pdctl.remote.here import is_here, listens_here
from pdctl.remote.local import LocalTransport
from pdctl.remote.ssh import SshTransport
from pdctl.remote.sshconnect import SshOptions, Target
from pdctl.topology import load
from tests.lifecycle.conftest import topology_yaml

ELSEWHERE = "198.51.100.7"  # TEST-NET-2: never an address of this machine


def _own_address() -> str:
    """A non-loopback IPv4 address of one of this machine's interfaces."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        return line.split()[3].split("/")[0]
    pytest.skip("this machine has no non-loopback IPv4 address")


def _ssh(hostname: str, proxy_jump: str | None = None) -> SshTransport:
    target = Target(label=f"root@{hostname}:22", hostname=hostname, port=22, user="root", identity_files=(),
                    proxy_jump=proxy_jump)
    return SshTransport("h1", target, [], SshOptions())


def _hint(tmp_path: Path, address: str, transport: Transport) -> tuple[str, str]:
    kind = "local" if isinstance(transport, LocalTransport) else "ssh"
    file = tmp_path / "reach.yaml"
    file.write_text(topology_yaml("reach", tmp_path / "work", nodes=[
        {"name": "h1", "address": address, "transport": kind}], placement=("h1", "h1", "h1"), python_venv="/opt/venv"))
    topo = load(file)
    router = entry(plan(topo))
    return reach_hint(topo, router, transport), router.url


def test_addresses_of_this_machine() -> None:
    assert is_here("127.0.0.1") and is_here("localhost") and is_here(_own_address())
    assert not is_here(ELSEWHERE)
    assert not is_here("no-such-host.invalid")


def test_a_router_on_another_machine_gets_a_port_forward(tmp_path: Path) -> None:
    hint, url = _hint(tmp_path, ELSEWHERE, _ssh(ELSEWHERE))
    assert hint.startswith(f"router: {url} on h1, reached over SSH; from here: `pdctl port-forward -t ")
    assert f"then http://127.0.0.1:{url.rsplit(':', 1)[1]}" in hint


def test_loopback_on_a_remote_host_is_that_hosts_own(tmp_path: Path) -> None:
    """127.0.0.1 on an SSH host elsewhere (or behind a jump host) is not this machine's 127.0.0.1."""
    assert "pdctl port-forward" in _hint(tmp_path, "127.0.0.1", _ssh(ELSEWHERE))[0]
    assert "pdctl port-forward" in _hint(tmp_path, "127.0.0.1", _ssh("127.0.0.1", proxy_jump="bastion"))[0]
    assert not listens_here(_ssh(_own_address(), proxy_jump="bastion"), _own_address())


@pytest.mark.parametrize("where", ["ssh to loopback", "ssh to this machine's address", "this machine's address",
                                   "local"])
def test_a_router_on_this_machine_gets_its_url(tmp_path: Path, where: str) -> None:
    own = _own_address()
    address, transport = {
        "ssh to loopback": ("127.0.0.1", _ssh("localhost")),
        "ssh to this machine's address": ("127.0.0.1", _ssh(own)),
        "this machine's address": (own, _ssh(own)),
        "local": ("127.0.0.1", LocalTransport()),
    }[where]
    hint, url = _hint(tmp_path, address, transport)
    assert url.startswith(f"http://{address}:")
    assert "port-forward" not in hint
    if where == "local":
        assert hint == f"router: {url}"
    else:
        assert hint == f"router: {url} on h1, which is this machine: open {url} directly"
