"""`status`'s line on how to reach the router: a port-forward for a router on another machine, the router's own URL
when it listens on this one (local transport, an address of this machine, or SSH to this machine), down to a real
deployment over a real sshd on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import down
from pdctl.lifecycle.watch.status import reach_hint
from pdctl.plan import entry, plan
from pdctl.remote.base import Transport
from pdctl.remote.here import is_here, listens_here
from pdctl.remote.local import LocalTransport
from pdctl.remote.ssh import SshTransport
from pdctl.remote.sshconnect import SshOptions, Target
from pdctl.topology import load
from tests.conftest import free_port
from tests.lifecycle.conftest import MakeTopo, topology_yaml
from tests.support.netns import SSHD, prepare_keys

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


@pytest.fixture
def sshd_here(tmp_path: Path) -> Iterator[tuple[int, SshOptions]]:
    """A real sshd in this machine's own network namespace, on 127.0.0.1: the "SSH to a local sshd" setup."""
    keys = tmp_path / "sshd-here"
    client_key = prepare_keys(keys)
    host_key = keys / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    port = free_port()
    cfg = keys / "sshd.conf"
    cfg.write_text(f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\nPidFile {keys}/sshd.pid\n"
                   f"AuthorizedKeysFile {keys}/authorized_keys\nPermitRootLogin prohibit-password\n"
                   "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                   "MaxSessions 100\nMaxStartups 100\nSubsystem sftp internal-sftp\n")
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=(keys / "sshd.log").open("ab"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert sshd.poll() is None and time.monotonic() < deadline, (keys / "sshd.log").read_text()
                time.sleep(0.1)
        config = keys / "ssh_config"
        config.write_text(f"Host here\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {client_key}\n")
        known = keys / "known_hosts"
        kind, key = host_key.with_suffix(".pub").read_text().split()[:2]
        known.write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
        yield port, SshOptions(ssh_config=config, known_hosts=known)
    finally:
        sshd.terminate()
        sshd.wait(10)


@pytest.mark.ssh
@pytest.mark.slow
def test_status_over_ssh_to_this_machine_gives_the_routers_url(
    make_topo: MakeTopo, sshd_here: tuple[int, SshOptions], node_venv: str, console: Console
) -> None:
    """A deployment on a node reached by SSH that is this machine: `status` says to open the router's URL, and it
    answers there (a port-forward to the router's own port would find it taken)."""
    port, ssh = sshd_here
    topo = make_topo(nodes=[{"name": "here", "address": "127.0.0.1", "port": port, "ssh_alias": "here",
                             "transport": "ssh"}], python_venv=node_venv, placement=("here", "here", "here"))
    args = ["-t", topo.file, "--ssh-config", str(ssh.ssh_config), "--known-hosts", str(ssh.known_hosts)]
    try:
        started = CliRunner().invoke(app, ["up", "--skip-provision", *args])
        assert started.exit_code == 0, started.output
        shown = CliRunner().invoke(app, ["status", *args], terminal_width=300)
        assert shown.exit_code == 0, shown.output
        url = f"http://127.0.0.1:{topo.router.port}"
        assert f"router: {url} on here, which is this machine: open {url} directly" in shown.stdout
        assert "port-forward" not in shown.stdout
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        down(topo, console, ssh=ssh, timeout=10)  # make_topo leaves a node on a port other than 22 to its test
