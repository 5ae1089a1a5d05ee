"""up -> status -> down of a simulated deployment on this machine, and the ways it can go wrong."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.errors import LaunchError
from pdctl.lifecycle import UpOptions, down, status, up
from pdctl.lifecycle.watch.status_view import render_status
from pdctl.remote.local import LocalTransport
from pdctl.state import StateStore
from tests.lifecycle.conftest import MakeTopo

pytestmark = pytest.mark.slow


def test_up_status_up_again_down(make_topo: MakeTopo, console: Console, tmp_path: Path) -> None:
    topo = make_topo()
    dep = up(topo, console)
    assert dep.started == ["decode-0", "prefill-0", "router"]
    assert dep.smoke is not None and (dep.smoke.turn1.outcome, dep.smoke.turn2.outcome) == ("miss", "hit")
    assert dep.smoke.turn2.tokens > 0
    saved = StateStore(topo.name).load()
    assert saved is not None and set(saved.processes) == {"decode-0", "prefill-0", "router"}
    assert saved.smoke is not None and saved.router_url == dep.router_url

    report = status(topo)
    assert report.healthy, report
    assert [(p.name, p.alive, p.health) for p in report.processes] == [
        ("decode-0", True, "ok"), ("prefill-0", True, "ok"), ("router", True, "ok"),
    ]
    assert {p.name: p.pid for p in report.processes} == {n: r.pid for n, r in saved.processes.items()}
    decode = report.processes[0]
    assert decode.metrics is not None and decode.metrics.nixl_transfers >= 1
    assert report.router is not None and report.router.hit >= 1 and report.router.reused_tokens_total > 0
    wide = Console(width=200, file=io.StringIO(), color_system=None)
    render_status(report, wide)
    text = wide.file.getvalue()  # type: ignore[attr-defined]
    assert "decode-0" in text and "reuse hit 1 / partial 0 / miss 1" in text

    logs = CliRunner().invoke(app, ["logs", "router", "-t", str(tmp_path / f"{topo.name}.yaml"), "-n", "200"])
    assert logs.exit_code == 0 and "=== pdctl: starting at" in logs.stdout
    unknown = CliRunner().invoke(app, ["logs", "nope", "-t", str(tmp_path / f"{topo.name}.yaml")])
    assert unknown.exit_code == 2 and "no process 'nope'" in unknown.stderr

    again = up(topo, console)
    assert again.started == [] and again.kept == ["decode-0", "prefill-0", "router"]
    assert again.smoke is not None and again.smoke.turn2.outcome == "hit"

    first = down(topo, console)
    assert sorted(first.stopped["local"]) == sorted(r.pid for r in saved.processes.values())
    assert LocalTransport().find_by_marker(topo.name) == []
    assert not StateStore(topo.name).path.exists()
    assert down(topo, console).nothing_was_running


def test_process_killed_behind_our_back(make_topo: MakeTopo, console: Console, tmp_path: Path) -> None:
    topo = make_topo()
    up(topo, console, UpOptions(smoke=False))
    state = StateStore(topo.name).load()
    assert state is not None
    os.kill(state.processes["prefill-0"].pid, signal.SIGKILL)
    report = status(topo)
    prefill = next(p for p in report.processes if p.name == "prefill-0")
    assert (prefill.alive, prefill.health, prefill.pid) == (False, "down", None)
    assert not report.healthy
    result = CliRunner().invoke(app, ["status", "-t", str(tmp_path / f"{topo.name}.yaml"), "--json"])
    assert result.exit_code == 1 and '"healthy": false' in result.stdout
    down(topo, console)
    assert LocalTransport().find_by_marker(topo.name) == []


def test_lost_state_file(make_topo: MakeTopo, console: Console) -> None:
    topo = make_topo()
    up(topo, console, UpOptions(smoke=False))
    StateStore(topo.name).delete()
    with pytest.raises(LaunchError) as info:
        up(topo, console, UpOptions(smoke=False))
    assert "already running with other settings (or not recorded in the state file)" in str(info.value)
    assert "--restart" in info.value.hint
    report = down(topo, console)
    assert not report.state_file_found and len(report.stopped["local"]) == 3
    assert LocalTransport().find_by_marker(topo.name) == []


def test_restart_replaces_every_process(make_topo: MakeTopo, console: Console) -> None:
    topo = make_topo()
    up(topo, console, UpOptions(smoke=False))
    before = StateStore(topo.name).load()
    dep = up(topo, console, UpOptions(restart=True))
    assert dep.started == ["decode-0", "prefill-0", "router"]
    assert before is not None
    assert all(dep.processes[n].pid != before.processes[n].pid for n in dep.started)
    assert {p.pid for p in LocalTransport().find_by_marker(topo.name) if p.pid == p.pgid} == {
        r.pid for r in dep.processes.values()
    }
