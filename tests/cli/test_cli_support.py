"""The error boundary every command shares: --debug anywhere, and where an internal error's traceback goes."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.cli.errors import DEBUG, call


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_is_accepted_before_or_after_the_subcommand(tmp_path: Path, where: str) -> None:
    bad = tmp_path / "topo.yaml"
    bad.write_text("name: Bad Name\n")
    args = ["validate", "-t", str(bad)]
    result = CliRunner().invoke(app, ["--debug", *args] if where == "before" else [*args, "--debug"])
    assert result.exit_code == 2, result.output
    assert "Traceback (most recent call last)" in result.stderr
    assert "Error: invalid topology" in result.stderr
    quiet = CliRunner().invoke(app, args)
    assert quiet.exit_code == 2 and "Traceback" not in quiet.stderr


def test_debug_after_a_nested_subcommand_and_after_the_options() -> None:
    result = CliRunner().invoke(app, ["router", "serve", "--prefill", "http://127.0.0.1:1", "--decode",
                                      "http://127.0.0.1:2", "--log-level", "foo", "--debug"])
    assert result.exit_code == 2, result.output
    assert "Traceback (most recent call last)" in result.stderr


def test_an_internal_error_logs_under_pdctl_home_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PDCTL_HOME", str(home))
    monkeypatch.delenv("PDCTL_DEBUG_LOG", raising=False)
    monkeypatch.setitem(DEBUG, "on", False)

    def broken() -> None:
        raise ZeroDivisionError("boom")

    with pytest.raises(typer.Exit) as exit_info:
        call(broken)
    assert exit_info.value.exit_code == 1
    log = home / "pdctl-debug.log"
    assert "ZeroDivisionError: boom" in log.read_text()
    assert list(cwd.iterdir()) == []
