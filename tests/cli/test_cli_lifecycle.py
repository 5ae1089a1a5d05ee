"""Bad lifecycle input is refused with one line and exit 2, before any host is touched."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app

TOPO = Path(__file__).resolve().parents[2] / "configs" / "local-sim.yaml"


def test_status_watch_must_be_positive() -> None:
    for value in ("-1", "0"):
        result = CliRunner().invoke(app, ["status", "-t", str(TOPO), "--watch", value])
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            f"Error: --watch {value} is not a positive number of seconds",
            "hint: e.g. --watch 2",
        ]
