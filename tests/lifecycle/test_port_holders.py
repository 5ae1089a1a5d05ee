"""A port `up` needs is taken: the preflight names who holds it (pid and command from `ss -ltnp`, and the pdctl
deployment from its PDCTL_DEPLOYMENT marker), with a real listener on loopback holding it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.facts.host import PortHolder
from pdctl.lifecycle.bringup.preflight import holder_words
from pdctl.markers import MARKER
from pdctl.topology import Topology
from tests.lifecycle.conftest import MakeTopo

pytestmark = pytest.mark.slow
LISTEN = "import socket, sys\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\n" \
         "print('ready', flush=True)\nsys.stdin.read()\n"
Listen = Callable[[int, str | None], subprocess.Popen[str]]


@pytest.fixture
def listen() -> Iterator[Listen]:
    """Start a process listening on a port, with PDCTL_DEPLOYMENT set or not; each one is ended after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(port: int, deployment: str | None) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if k != MARKER} | ({MARKER: deployment} if deployment else {})
        proc = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _up(topo: Topology) -> list[str]:
    result = CliRunner().invoke(app, ["up", "-t", str(topo.file), "--skip-provision"])
    assert result.exit_code == 1, result.output
    return result.stderr.splitlines()


def test_a_port_held_by_another_deployment_names_its_process_and_deployment(make_topo: MakeTopo,
                                                                           listen: Listen) -> None:
    topo = make_topo()
    port = topo.decode[0].port
    holder = listen(port, "h33-other")
    assert _up(topo) == [
        "Error: preflight failed:",
        f"  local: port {port} needed by decode-0 is in use by pid {holder.pid} ({_comm(holder.pid)}) of pdctl "
        "deployment `h33-other`: `pdctl status -t <its topology file>` shows it, `pdctl down -t <its topology "
        "file>` stops it",
        # the fix names the deployment that holds it, not this one
        f"hint: stop deployment `h33-other` (`pdctl down -t <its topology file>`) or give decode-0 another port "
        f"in {topo.file}",
    ]


def test_a_port_held_by_this_deployment_says_so(make_topo: MakeTopo, listen: Listen) -> None:
    topo = make_topo()
    port = topo.router.port
    holder = listen(port, topo.name)
    assert _up(topo) == [
        "Error: preflight failed:",
        f"  local: port {port} needed by router is in use by pid {holder.pid} ({_comm(holder.pid)}), a process of "
        f"this deployment ({topo.name}): `pdctl status -t {topo.file}` shows it, `pdctl down -t {topo.file}` "
        "stops it",
        f"hint: `pdctl down -t {topo.file}` stops what is left of {topo.name}, then `pdctl up` starts it afresh",
    ]


def test_a_plain_listener_is_named_by_pid_and_command(make_topo: MakeTopo, listen: Listen) -> None:
    topo = make_topo()
    port = topo.prefill[0].port
    holder = listen(port, None)
    assert _up(topo)[1:] == [
        f"  local: port {port} needed by prefill-0 is in use by pid {holder.pid} ({_comm(holder.pid)})",
        f"hint: stop pid {holder.pid} on local or give prefill-0 another port in {topo.file}",
    ]


def test_a_holder_pdctl_cannot_see_or_no_ss(make_topo: MakeTopo) -> None:
    topo = make_topo()
    assert holder_words(topo, "h2", 8000, [PortHolder(8000)]) == (
        "by a process pdctl cannot see (run `sudo ss -ltnp 'sport = :8000'` on h2)")
    assert holder_words(topo, "h2", 8000, None) == (
        "by a process pdctl cannot name (iproute2's `ss` is not on h2; `sudo lsof -iTCP:8000 -sTCP:LISTEN` there "
        "shows it)")


def test_doctor_names_the_holder_of_a_busy_port(make_topo: MakeTopo, listen: Listen) -> None:
    topo = make_topo()
    port = topo.prefill[0].port
    holder = listen(port, "h33-other")
    result = CliRunner().invoke(app, ["doctor", "-t", str(topo.file), "--json"])
    assert result.exit_code == 1, result.output
    checks = {c["name"]: c for h in json.loads(result.stdout)["hosts"] for c in h["checks"]}
    assert checks["ports"]["value"] == (
        f"busy: {port} by pid {holder.pid} ({_comm(holder.pid)}) of pdctl deployment `h33-other`: `pdctl status -t "
        "<its topology file>` shows it, `pdctl down -t <its topology file>` stops it")
