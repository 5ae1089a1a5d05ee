"""A state path that is a directory: `down` stops the deployment by its marker and says what to remove (exit 0,
no traceback); `status` refuses it with the same fix (exit 1)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, up
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo


def test_down_and_status_with_the_state_path_a_directory(make_topo: MakeTopo, console: Console,
                                                         tmp_path: Path) -> None:
    topo = make_topo()
    up(topo, console, UpOptions(smoke=False))
    path = StateStore(topo.name).path
    path.unlink()
    path.mkdir()
    file = str(tmp_path / f"{topo.name}.yaml")
    runner = CliRunner(env={"COLUMNS": "1000"})

    status = runner.invoke(app, ["status", "-t", file])
    assert status.exit_code == 1, status.output
    assert status.stderr.splitlines() == [
        f"Error: {path} is a directory, not a pdctl state file",
        f"hint: remove it (`rm -r {path}`); `pdctl down` still finds the processes of {topo.name} by their marker",
    ]

    down = runner.invoke(app, ["down", "-t", file])
    assert down.exit_code == 0, down.output
    assert LocalTransport().find_by_marker(topo.name) == []
    lines = down.stderr.splitlines()
    assert lines[0] == (f"warning: {path} is a directory, not a pdctl state file; finding processes by their marker "
                        "instead")
    assert lines[-1] == (f"warning: cannot remove {path}: Is a directory; remove it by hand (`rm -r {path}`)")
    assert "Traceback" not in down.output and "Internal error" not in down.output
    assert down.stdout == f"down {topo.name}: 3 process(es) stopped, nothing left running\n"
