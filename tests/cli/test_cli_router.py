"""`pdctl router serve` refuses bad options with a message, not a traceback from the server."""

from __future__ import annotations

from pathlib import Path

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


def test_a_state_dir_the_router_cannot_write_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = CliRunner().invoke(app, ["router", "serve", "--prefill", "http://127.0.0.1:1", "--decode",
                                      "http://127.0.0.1:2", "--state-dir", str(blocker)])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0].startswith(f"Error: --state-dir {blocker}: cannot make {blocker}/kv-journal")
    assert "hint: give a directory this user can write" in result.stderr
    assert "Traceback" not in result.output


def test_retention_marks_in_the_wrong_order_are_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["router", "serve", "--prefill", "http://127.0.0.1:1", "--decode",
                                      "http://127.0.0.1:2", "--retain-high-kv", "0.5", "--retain-target-kv", "0.7"])
    assert result.exit_code == 2, result.output
    assert "--retain-target-kv must be above 0 and below --retain-high-kv (0.5), got 0.7" in result.stderr
