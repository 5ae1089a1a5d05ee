"""`down` with a state file that is not one (wrong encoding, wrong shapes): the marker finds the processes."""

from __future__ import annotations

import pytest
from rich.console import Console

from pdctl.lifecycle import UpOptions, down, up
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"name": "caf\xe9"}', "UnicodeDecodeError"),
        (b'{"name": "x", "processes": [1, 2]}', "`processes` is not an object of process records"),
        (b'[{"name": "x"}]', "the document is a list, not an object"),
        (b'{"name": "x", "processes": {"router": {"name": "router", "role": "router", "node": "local", '
         b'"host": "h", "pid": "12", "unit": null, "log_path": "l", "ports": [1], "url": "u", "health_url": "u", '
         b'"started_at": 0, "argv_hash": "a"}}}', "a process record has a field of the wrong type"),
    ],
)
def test_down_falls_back_to_the_marker(make_topo: MakeTopo, console: Console, content: bytes, why: str) -> None:
    topo = make_topo()
    up(topo, console, UpOptions(smoke=False))
    store = StateStore(topo.name)
    store.path.write_bytes(content)
    wide = Console(width=2000, color_system=None)  # the state file's path on one line
    with wide.capture() as captured:
        report = down(topo, wide)
    assert not report.state_file_found
    assert len(report.stopped["local"]) == 3
    assert LocalTransport().find_by_marker(topo.name) == []
    shown = " ".join(captured.get().split())
    assert f"warning: {store.path} is not a pdctl state file" in shown
    assert why in shown
    assert "finding processes by their marker instead" in shown
