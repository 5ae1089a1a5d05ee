"""`status` for people: readable at 80 columns (the processes, then the engines' metrics), and one line with the
way to start it when nothing of the deployment runs (no table of "down" rows, no router ConnectError)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.lifecycle import UpOptions, down, up
from tests.lifecycle.conftest import MakeTopo


def test_status_fits_80_columns_then_says_not_running_after_down(make_topo: MakeTopo, console: Console,
                                                                 tmp_path: Path) -> None:
    topo = make_topo()
    file = tmp_path / f"{topo.name}.yaml"
    runner = CliRunner(env={"COLUMNS": "80"})
    up(topo, console, UpOptions())
    shown = runner.invoke(app, ["status", "-t", str(file)])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    tables = [line for line in lines if not line.startswith("router")]  # the router's sentence may wrap
    assert max(len(line) for line in tables) <= 80, shown.stdout
    words = [line.split() for line in tables if line.strip() and not set(line.strip()) <= {"─"}]
    assert words[0] == [topo.name]
    assert words[1] == ["process", "node", "pid", "health", "uptime"]
    assert [(w[0], w[1], w[3]) for w in words[2:5]] == [
        ("decode-0", "local", "ok"), ("prefill-0", "local", "ok"), ("router", "local", "ok")]  # no cell folded
    # the simulator says how many blocks it keeps for a peer (vLLM does not: no such column)
    assert words[5] == ["engine", "run/wait", "KV", "retained", "NIXL", "xfers", "failed", "expired"]
    assert [w[0] for w in words[6:8]] == ["decode-0", "prefill-0"]
    assert words[6][5] == "1"  # the smoke test's transfer
    # the smoke test's conversation is pinned on the decode: the router's retained KV against the decode's
    assert words[8][:4] == ["retained", "KV", "(kept", "on"]
    assert words[9] == ["decode", "KV", "used", "retained", "of", "its", "KV", "handles", "queued"]
    assert words[10][0] == "decode-0" and words[10][5:] == ["1", "0"], words[10]  # one handle, no release queued

    down(topo, console)
    after = runner.invoke(app, ["status", "-t", str(file)])
    assert after.exit_code == 1, after.output
    assert after.stdout == f"{topo.name}: not running (no process of it on local, no state file)\n"
    assert after.stderr == f"hint: start it with `pdctl up -t {file}`\n"
