"""A simulated deployment across SSH test hosts (network namespaces with real sshd): router, P and D each on
its own host, driven through the CLI and the library."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.errors import ConnectError
from pdctl.lifecycle import UpOptions, down, status, up
from pdctl.remote.local import LocalTransport
from pdctl.remote.sshconnect import SshOptions
from pdctl.state import StateStore
from pdctl.topology import Topology
from tests.conftest import free_port
from tests.lifecycle.conftest import MakeTopo
from tests.support.netns import SshLab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _nodes(lab: SshLab, dead_port: int | None = None) -> list[dict[str, object]]:
    nodes: list[dict[str, object]] = [
        {"name": h.node, "address": h.address, "ssh_alias": h.node, "transport": "ssh"} for h in lab.hosts
    ]
    if dead_port is not None:
        nodes[2] = {**nodes[2], "port": dead_port, "ssh_alias": "null", "user": "root"}
    return nodes


def _netns_of(pid: int) -> str:
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def test_deploy_across_ssh_hosts(make_topo: MakeTopo, lab: SshLab, node_venv: str, tmp_path: Path) -> None:
    ssh_config, known_hosts = lab.ssh_config(), tmp_path / "known_hosts"
    cleanup = SshOptions(ssh_config=ssh_config, known_hosts=lab.known_hosts())
    topo: Topology = make_topo(
        nodes=_nodes(lab), python_venv=node_venv, placement=("h2", "h3", "h1"), ssh=cleanup
    )
    topo_file = str(tmp_path / f"{topo.name}.yaml")
    ssh_args = ["--ssh-config", str(ssh_config), "--known-hosts", str(known_hosts)]
    runner = CliRunner()

    refused = runner.invoke(app, ["up", "-t", topo_file, "--skip-provision", *ssh_args])
    assert refused.exit_code == 1
    assert "is not in" in refused.stderr and "--accept-new-host-keys" in refused.stderr
    assert LocalTransport().find_by_marker(topo.name) == []

    result = runner.invoke(app, ["up", "-t", topo_file, "--skip-provision", "--accept-new-host-keys", *ssh_args])
    assert result.exit_code == 0, result.stderr
    assert "turn 2 hit" in result.stderr and f"router: http://{lab.hosts[0].address}:" in result.stdout
    assert len(known_hosts.read_text().splitlines()) == 3

    state = StateStore(topo.name).load()
    assert state is not None
    where = {name: _netns_of(rec.pid) for name, rec in state.processes.items()}
    assert where == {"router": lab.hosts[0].netns, "prefill-0": lab.hosts[1].netns, "decode-0": lab.hosts[2].netns}

    report = status(topo, ssh=SshOptions(ssh_config=ssh_config, known_hosts=known_hosts))
    assert report.healthy and report.router is not None and report.router.hit == 1

    again = runner.invoke(app, ["up", "-t", topo_file, "--skip-provision", *ssh_args])
    assert again.exit_code == 0 and "already running, no changes" in again.stdout

    gone = runner.invoke(app, ["down", "-t", topo_file, *ssh_args])
    assert gone.exit_code == 0, gone.stderr
    assert "3 process(es) stopped" in gone.stdout
    assert LocalTransport().find_by_marker(topo.name) == []


def test_host_that_is_down_stops_up_before_anything_starts(
    make_topo: MakeTopo, lab: SshLab, node_venv: str, console: Console
) -> None:
    dead = free_port()
    opts = SshOptions(ssh_config=lab.ssh_config(), known_hosts=lab.known_hosts())
    topo = make_topo(nodes=_nodes(lab, dead_port=dead), python_venv=node_venv, placement=("h2", "h3", "h1"))
    with pytest.raises(ConnectError) as info:
        up(topo, console, UpOptions(ssh=opts, provision=False))
    assert str(info.value) == f"h3: unreachable: root@{lab.hosts[2].address}:{dead}: connection refused"
    assert LocalTransport().find_by_marker(topo.name) == []
    with pytest.raises(ConnectError) as info:
        down(topo, console, ssh=opts)
    assert str(info.value).startswith("h3: could not reach the host(s) to stop their processes")
    assert "bring the host back" in info.value.hint


def test_status_json_with_one_host_unreachable(make_topo: MakeTopo, lab: SshLab, node_venv: str,
                                               tmp_path: Path) -> None:
    dead = free_port()
    topo = make_topo(nodes=_nodes(lab, dead_port=dead), python_venv=node_venv, placement=("h2", "h3", "h1"))
    args = ["--ssh-config", str(lab.ssh_config()), "--known-hosts", str(lab.known_hosts())]
    result = CliRunner().invoke(app, ["status", "--json", "-t", str(tmp_path / f"{topo.name}.yaml"), *args])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["healthy"] is False
    assert report["unreachable"] == {"h3": f"h3: unreachable: root@{lab.hosts[2].address}:{dead}: connection refused"}
    health = {p["name"]: (p["node"], p["health"]) for p in report["processes"]}
    assert health == {"decode-0": ("h3", "unreachable"), "prefill-0": ("h2", "down"), "router": ("h1", "down")}
