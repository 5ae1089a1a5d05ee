"""A secret in the topology reaches the process but no display: not a failed start's script, not the state file."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.errors import LaunchError
from pdctl.lifecycle import UpOptions, down, up
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo
from tests.support.venvs import script_venv

TOKEN = "hf_sekrit_0123456789abcdef"
ENV = f"env: {{all: {{HF_TOKEN: {TOKEN}}}, decode: {{MY_THING: x{TOKEN}}}, secret: [MY_THING]}}\n"


def test_the_process_gets_the_secret_and_nothing_shows_it(make_topo: MakeTopo, console: Console) -> None:
    topo = make_topo(extra_yaml=ENV)
    with console.capture() as captured:
        dep = up(topo, console, UpOptions(smoke=False))
    decode = next(p for p in LocalTransport().find_by_marker(topo.name) if p.process == "decode-0"
                  and p.pid == dep.processes["decode-0"].pid)
    environ = Path(f"/proc/{decode.pid}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={TOKEN}".encode() in environ and f"MY_THING=x{TOKEN}".encode() in environ
    assert TOKEN not in captured.get()
    assert TOKEN not in StateStore(topo.name).path.read_text()
    for record in dep.processes.values():
        assert TOKEN not in Path(record.log_path).read_text()
    down(topo, console)


def test_a_failed_start_prints_its_script_masked(make_topo: MakeTopo, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    node = {"name": "local", "address": "127.0.0.1", "transport": "local", "work_dir": f"{blocker}/work"}
    topo = make_topo(extra_yaml=ENV, nodes=[node])
    result = CliRunner().invoke(app, ["up", "-t", str(tmp_path / f"{topo.name}.yaml"), "--no-smoke-test"],
                                terminal_width=400)
    assert result.exit_code == 1, result.output
    assert "exited 3" in result.output  # the start script could not make its work directory
    assert "env -- " in result.output and "'HF_TOKEN=***'" in result.output and "'MY_THING=***'" in result.output
    assert TOKEN not in result.output
    assert LocalTransport().find_by_marker(topo.name) == []


def test_a_dying_engines_log_tail_is_scrubbed(make_topo: MakeTopo, console: Console, tmp_path: Path) -> None:
    venv = script_venv(tmp_path / "venv", 'echo "starting with token $HF_TOKEN"; exit 1')
    topo = make_topo(python_venv=venv, extra_yaml=ENV)
    with pytest.raises(LaunchError) as info:
        up(topo, console, UpOptions(provision=False, timeout=60))
    assert "starting with token ***" in info.value.message
    assert TOKEN not in info.value.message
