"""The error boundary every command runs in: --debug anywhere, one line and an exit code for each kind of failure,
and where an internal error's traceback goes."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.cli.errors import DEBUG, call
from pdctl.cli.root import RootGroup
from pdctl.errors import PdctlError


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


def _app() -> typer.Typer:
    """An app built like pdctl's (the same root group and --debug), with commands that fail in each way."""
    made = typer.Typer(cls=RootGroup, add_completion=False, pretty_exceptions_enable=False)

    @made.callback()
    def _root(debug: bool = typer.Option(False, "--debug")) -> None:
        DEBUG["on"] = debug

    @made.command()
    def broken() -> None:
        raise ZeroDivisionError("boom in a command")

    @made.command()
    def refused() -> None:
        raise PdctlError("the thing failed", hint="do the other thing")

    @made.command()
    def interrupted() -> None:
        raise KeyboardInterrupt

    return made


BROKEN_LINE = Path(__file__).read_text().splitlines().index('        raise ZeroDivisionError("boom in a command")') + 1


@pytest.fixture
def debug_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "debug.log"
    monkeypatch.setenv("PDCTL_DEBUG_LOG", str(log))
    monkeypatch.setitem(DEBUG, "on", False)
    return log


def test_an_unexpected_exception_is_one_line_and_exit_1_with_the_traceback_in_the_log(debug_log: Path) -> None:
    result = CliRunner().invoke(_app(), ["broken"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"Internal error: ZeroDivisionError: boom in a command (test_errors.py:{BROKEN_LINE})",
        f"hint: full traceback in {debug_log}; rerun with --debug",
    ]
    assert result.stdout == ""
    logged = debug_log.read_text()
    assert logged.startswith("Traceback (most recent call last):")
    assert logged.rstrip().endswith("ZeroDivisionError: boom in a command")


def test_with_debug_the_traceback_is_shown_too(debug_log: Path) -> None:
    result = CliRunner().invoke(_app(), ["broken", "--debug"])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-3] == "ZeroDivisionError: boom in a command"
    assert lines[-2:] == [
        f"Internal error: ZeroDivisionError: boom in a command (test_errors.py:{BROKEN_LINE})",
        f"hint: full traceback in {debug_log}; rerun with --debug",
    ]
    assert "ZeroDivisionError: boom in a command" in debug_log.read_text()


def test_a_pdctl_error_and_an_interrupt(debug_log: Path) -> None:
    refused = CliRunner().invoke(_app(), ["refused"])
    assert refused.exit_code == 1
    assert refused.stderr.splitlines() == ["Error: the thing failed", "hint: do the other thing"]
    interrupted = CliRunner().invoke(_app(), ["interrupted"])
    assert interrupted.exit_code == 130
    assert interrupted.stderr.splitlines() == ["interrupted"]
    assert not debug_log.exists()


def test_typer_usage_errors_pass_through_the_boundary(debug_log: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--watch", "soon"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "Internal error" not in result.stderr and "Invalid value for '--watch'" in result.stderr
    assert not debug_log.exists()


CLOSED_PIPE = """
import sys
from pdctl.cli import output
def closed(*args, **kwargs):
    raise BrokenPipeError(32, "Broken pipe")
output.out.print = closed
from pdctl.cli.root import main
sys.argv = ["pdctl", "validate", "-t", sys.argv[1]]
main()
"""


def test_a_reader_that_leaves_early_is_no_internal_error(tmp_path: Path) -> None:
    """`pdctl validate | head -0`: stdout's write fails; click exits 1 without a word, not an "Internal error"
    with a saved traceback."""
    import subprocess
    import sys

    topo = Path(__file__).resolve().parents[2] / "configs" / "local-sim.yaml"
    env = {"PATH": "", "PDCTL_DEBUG_LOG": str(tmp_path / "debug.log")}
    done = subprocess.run([sys.executable, "-c", CLOSED_PIPE, str(topo)], capture_output=True, text=True, env=env,
                          timeout=60)
    assert (done.returncode, done.stderr) == (1, "")
    assert not (tmp_path / "debug.log").exists()
