"""A private cluster: pdctl runs in a namespace with no route to the nodes, reaches them through a bastion
(`Include` + `ProxyJump`, or a `ProxyCommand`), and every stage works: up, status, bench, logs, down."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdctl.remote.local import LocalTransport
from tests.lifecycle.conftest import topology_yaml
from tests.support.bastion import PrivateLab, private_lab

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@pytest.fixture(scope="module")
def plab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateLab]:
    with private_lab(tmp_path_factory.mktemp("private-lab"), count=3) as lab:
        yield lab


def _deployment(lab: PrivateLab, tmp: Path, venv: str, hop: str) -> tuple[str, Path, dict[str, str]]:
    name = f"pv-{uuid.uuid4().hex[:8]}"
    nodes: list[dict[str, object]] = [
        {"name": h.node, "address": h.address, "ssh_alias": h.node, "transport": "ssh"} for h in lab.hosts
    ]
    topo = tmp / f"{name}.yaml"
    topo.write_text(topology_yaml(name, tmp / "work", python_venv=venv, nodes=nodes, placement=("h2", "h3", "h1")))
    env = {"PDCTL_HOME": str(tmp / "home"), "PDCTL_SSH_CONFIG": str(lab.private_config(hop)),
           "PDCTL_KNOWN_HOSTS": str(lab.known_hosts()), "COLUMNS": "200"}
    return name, topo, env


def _up(lab: PrivateLab, topo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`pdctl up` from the CLI namespace; it starts everything and passes its smoke test."""
    up = lab.pdctl("up", "-t", str(topo), "--skip-provision", env=env)
    assert up.returncode == 0, up.stderr
    assert "turn 2 hit" in up.stderr
    return up


def _assert_stopped(down: subprocess.CompletedProcess[str], name: str) -> None:
    """`pdctl down` succeeded and left no process of deployment `name` on any host (one PID space)."""
    assert down.returncode == 0, down.stderr
    assert LocalTransport().find_by_marker(name) == []


def test_no_route_from_the_cli_namespace(plab: PrivateLab) -> None:
    probe = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=3)"
    direct = plab.in_cli("python3", "-c", probe, plab.hosts[0].address)
    assert direct.returncode == 1 and "Network is unreachable" in direct.stderr
    assert plab.bastion is not None
    assert plab.in_cli("python3", "-c", probe, plab.bastion.address).returncode == 0


def test_whole_lifecycle_through_a_proxyjump_bastion(plab: PrivateLab, node_venv: str, tmp_path: Path) -> None:
    name, topo, env = _deployment(plab, tmp_path, node_venv, "jump")
    try:
        up = _up(plab, topo, env)

        status = plab.pdctl("status", "--json", "-t", str(topo), env=env)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["healthy"] is True and report["router"]["hit"] == 1 and report["router"]["hit_rate"] > 0
        assert report["unreachable"] == {} and "pdctl port-forward" in report["reach"]

        out = tmp_path / "bench"
        bench = plab.pdctl("bench", "-t", str(topo), "--no-redeploy", "--lengths", "300", "--conversations", "1",
                           "--turns", "3", "--output-tokens", "8", "--clients", "1", "--no-warmup",
                           "--out", str(out), env=env)
        assert bench.returncode == 0, bench.stderr
        legs = json.loads((out / "legs.json").read_text())
        assert legs["workload"]["client"] == "router node h1"
        records = json.loads((out / "requests.json").read_text())
        assert [(r["turn"], r["reuse"]) for r in records] == [(0, "miss"), (1, "hit"), (2, "hit")]

        here = plab.pdctl("bench", "-t", str(topo), "--no-redeploy", "--lengths", "300", "--conversations", "1",
                          "--turns", "2", "--output-tokens", "8", "--clients", "1", "--no-warmup", "--client",
                          "local", "--out", str(tmp_path / "bench-local"), env=env)
        assert here.returncode == 0, here.stderr  # streamed through the SSH connection's channels
        assert json.loads((tmp_path / "bench-local" / "legs.json").read_text())["workload"]["client"] == "local"

        logs = plab.pdctl("logs", "router", "-t", str(topo), "-n", "200", env=env)
        assert logs.returncode == 0 and "Ready: 1 prefill, 1 decode instances" in logs.stdout

        _port_forward_reaches_the_router(plab, topo, env)
    finally:
        down = plab.pdctl("down", "-t", str(topo), env=env)
    _assert_stopped(down, name)
    assert "3 process(es) stopped, nothing left running" in down.stdout
    key_file = tmp_path / "work" / name / "engine.key"
    key = key_file.read_text().strip()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != key_file]
    assert any(p.suffix == ".log" for p in written) and not any("play-" in p.name for p in written)
    for text in [up.stdout, up.stderr, status.stdout, bench.stdout, bench.stderr, logs.stdout] + \
            [p.read_text(errors="replace") for p in written]:
        assert key not in text


def _port_forward_reaches_the_router(lab: PrivateLab, topo: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(["ip", "netns", "exec", lab.cli_netns, sys.executable, "-m", "pdctl", "port-forward",
                             "-t", str(topo), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **env})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        local = re.match(r"forwarding (http://127\.0\.0\.1:\d+) -> http://[\d.]+:\d+ on h1; Ctrl-C to stop", line)
        assert local, line + (proc.stderr.read() if proc.stderr else "")
        fetch = "import json, sys, urllib.request; print(json.load(urllib.request.urlopen(sys.argv[1]))['hit_rate'])"
        got = lab.in_cli("python3", "-c", fetch, f"{local.group(1)}/stats")
        assert got.returncode == 0 and float(got.stdout) > 0, got.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "port-forward stopped" in stderr


def test_up_status_down_through_a_proxycommand(plab: PrivateLab, node_venv: str, tmp_path: Path) -> None:
    name, topo, env = _deployment(plab, tmp_path, node_venv, "command")
    try:
        _up(plab, topo, env)
        status = plab.pdctl("status", "--json", "-t", str(topo), env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["healthy"] is True
    finally:
        down = plab.pdctl("down", "-t", str(topo), env=env)
    _assert_stopped(down, name)


def test_a_bastion_that_refuses_is_named_with_the_node(plab: PrivateLab, node_venv: str, tmp_path: Path) -> None:
    name, topo, env = _deployment(plab, tmp_path, node_venv, "jump")
    config = Path(env["PDCTL_SSH_CONFIG"])
    assert plab.bastion is not None
    config.write_text(config.read_text().replace(f"HostName {plab.bastion.address}\n",
                                                 f"HostName {plab.bastion.address}\n  Port 2\n"))
    up = plab.pdctl("up", "-t", str(topo), "--skip-provision", env=env)
    assert up.returncode == 1
    first = up.stderr.splitlines()[0]
    assert first.startswith(f"Error: h1: jump host bastion: unreachable: root@{plab.bastion.address}:2: "
                            "connection refused"), up.stderr
    status = plab.pdctl("status", "--json", "-t", str(topo), env=env)
    report = json.loads(status.stdout)
    assert status.returncode == 1 and report["healthy"] is False
    assert sorted(report["unreachable"]) == ["h1", "h2", "h3"]
    assert {p["health"] for p in report["processes"]} == {"unreachable"}
    assert LocalTransport().find_by_marker(name) == []
