"""`pdctl router serve` refuses bad options with a message, not a traceback from the server."""

from __future__ import annotations

from typer.testing import CliRunner

from pdctl.cli import app


def test_unknown_log_level_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["router", "serve", "--prefill", "http://127.0.0.1:1", "--decode",
                                      "http://127.0.0.1:2", "--log-level", "foo"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: --log-level 'foo' is not one of debug, info, warning, error",
        "hint: e.g. --log-level info",
    ]
    assert "Traceback" not in result.output
