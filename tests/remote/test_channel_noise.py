"""paramiko logs every refused `direct-tcpip` channel at ERROR ("Secsh channel N open FAILED"), and without a
handler Python prints that on stderr. pdctl opens such channels on purpose (health polls before an engine
listens, probes of a stopped process) and gets the refusal as an exception it reports itself, so the line must
not reach the user; other paramiko errors still do. pytest installs its own log handler, so the CLI runs here as
a real process, as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pdctl.remote import forward
from pdctl.remote.ssh import connect_ssh
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Node
from tests.conftest import free_port
from tests.lifecycle.conftest import node_venv, topology_yaml  # noqa: F401  # node_venv: the hosts' pdctl
from tests.support.netns import SshLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

NOISE = "open FAILED"


REFUSE_AND_LOG = """
import logging, sys
from pathlib import Path
import httpx
from pdctl.errors import ConnectError
from pdctl.remote.ssh import connect_ssh
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Node
cfg, kh, alias, address, port = sys.argv[1:]
options = SshOptions(ssh_config=Path(cfg), known_hosts=Path(kh))
t = connect_ssh(Node(name=alias, address=address, ssh_alias=alias), options)
try:
    with httpx.Client(transport=t.http()) as client:
        client.get(f"http://{address}:{port}/health")
except httpx.ConnectError as exc:
    print("http:", exc)
try:
    t.connect_tcp(address, int(port))
except ConnectError as exc:
    print("tcp:", exc)
logging.getLogger("paramiko.transport").error("Socket exception: a real one")
t.close()
"""


def test_a_refused_channel_is_reported_by_pdctl_once_and_other_paramiko_errors_still_show(lab: SshLab) -> None:
    h, port = lab.hosts[0], free_port()
    run = subprocess.run([sys.executable, "-c", REFUSE_AND_LOG, str(lab.ssh_config()), str(lab.known_hosts()),
                          h.node, h.address, str(port)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"http: {h.address}:{port} refused via SSH to h1" in run.stdout
    assert f"tcp: h1: {h.address}:{port} refused through SSH (root@{h.address}): Connect failed" in run.stdout
    assert NOISE not in run.stderr and "Socket exception: a real one" in run.stderr


def test_port_forward_says_when_the_far_side_refuses(lab: SshLab, capsys: pytest.CaptureFixture[str]) -> None:
    h, port = lab.hosts[0], free_port()
    t = connect_ssh(Node(name=h.node, address=h.address, ssh_alias=h.node),
                    SshOptions(ssh_config=lab.ssh_config(), known_hosts=lab.known_hosts()))
    listener, stop = forward.listen(0), threading.Event()
    server = threading.Thread(target=forward.serve, args=(listener, t, h.address, port, stop), daemon=True)
    server.start()
    try:
        with socket.create_connection(listener.getsockname(), timeout=10) as conn:
            assert conn.recv(1) == b""  # closed by the forwarder
    finally:
        stop.set()
        server.join(timeout=5)
        t.close()
    assert f"port-forward: h1: {h.address}:{port} refused through SSH" in capsys.readouterr().err


def _pdctl(*args: str, home: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PDCTL_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "pdctl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_ssh_up_status_bench_down_print_no_paramiko_channel_lines(
    lab: SshLab, node_venv: str, tmp_path: Path  # noqa: F811
) -> None:
    nodes: list[dict[str, object]] = [
        {"name": h.node, "address": h.address, "ssh_alias": h.node, "transport": "ssh"} for h in lab.hosts
    ]
    topo = tmp_path / "h41noise.yaml"
    topo.write_text(topology_yaml("h41noise", tmp_path / "work", python_venv=node_venv, nodes=nodes,
                                  placement=("h2", "h3", "h1")))
    home = tmp_path / "home"
    ssh = ["--ssh-config", str(lab.ssh_config()), "--known-hosts", str(lab.known_hosts())]
    try:
        up = _pdctl("up", "-t", str(topo), "--skip-provision", *ssh, home=home)
        assert up.returncode == 0, up.stderr
        assert "turn 2 hit" in up.stderr and NOISE not in up.stderr, up.stderr
        status = _pdctl("status", "-t", str(topo), *ssh, home=home)
        assert status.returncode == 0 and NOISE not in status.stderr, status.stderr
        # The running deployment, as one leg: the bench's own SSH work (the load player on the router's node, its
        # probes). A redeploy would be `up`'s work again (checked above) and, as the three hosts share this
        # filesystem and so the node venv, three concurrent installs of the shipped wheel into it.
        bench = _pdctl("bench", "-t", str(topo), "--no-redeploy", "--lengths", "200", "--conversations", "1",
                       "--turns", "2", "--out", str(tmp_path / "bench"), *ssh, home=home, timeout=300)
        assert bench.returncode == 0, bench.stderr
        assert (tmp_path / "bench" / "report.md").exists(), bench.stderr
        assert NOISE not in bench.stderr, bench.stderr
    finally:
        down = _pdctl("down", "-t", str(topo), *ssh, home=home)
    assert down.returncode == 0 and NOISE not in down.stderr, down.stderr
