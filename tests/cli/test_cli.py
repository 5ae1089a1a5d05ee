"""CLI conventions shared by every command."""

from __future__ import annotations

from typer.testing import CliRunner

from pdctl import __version__
from pdctl.cli import app


def test_version_needs_no_command() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == __version__


def test_every_command_explains_itself() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("validate", "plan", "doctor", "up", "status", "logs", "down", "bench", "router", "init",
                    "demo"):
        assert command in result.output, command
