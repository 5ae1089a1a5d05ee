"""`port-forward` to a router on this machine takes a free local port (the router holds its own), and Ctrl-C ends
it with exit 0; `logs -f` without a process is refused (exit 2) instead of ignoring -f."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, up
from tests.lifecycle.conftest import MakeTopo

LINE = r"forwarding (http://127\.0\.0\.1:(\d+)) -> http://127\.0\.0\.1:(\d+) on local; Ctrl-C to stop"


def test_port_forward_to_a_local_router_then_ctrl_c(make_topo: MakeTopo, console: Console, tmp_path: Path) -> None:
    topo = make_topo()
    up(topo, console, UpOptions(smoke=False))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl", "port-forward", "-t", str(tmp_path / f"{topo.name}.yaml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "300"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.match(LINE, line)
        assert found, line
        assert found[2] != found[3] == str(topo.router.port)
        assert httpx.get(f"{found[1]}/health", timeout=10).status_code == 200
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert stderr == "port-forward stopped\n"


def test_logs_follow_needs_one_process(make_topo: MakeTopo, tmp_path: Path) -> None:
    topo = make_topo()
    file = tmp_path / f"{topo.name}.yaml"
    result = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["logs", "-t", str(file), "-f"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: --follow follows one process's log: name it",
        f"hint: e.g. `pdctl logs -t {file} decode-0 -f`; the processes: decode-0, prefill-0, router",
    ]
