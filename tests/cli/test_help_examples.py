"""Each command's `--help` ends with examples a user can paste: every one parses as that command's options, and
every line fits an 80-column terminal."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.cli.help_examples import EXAMPLES, epilog

ROOT_GROUP: Any = typer.main.get_command(app)
COMMANDS = sorted(name for name, cmd in ROOT_GROUP.commands.items()
                  if not cmd.hidden and not hasattr(cmd, "commands"))


def _parse(line: str) -> None:
    """Each option of `line` (a `pdctl SUBCOMMAND ...` example, up to a comment, pipe or redirect) is one of that
    subcommand's, given a value when it takes one; at most as many bare words as the command has arguments."""
    words = shlex.split(line, comments=True)
    for stop in ("|", ">"):
        words = words[:words.index(stop)] if stop in words else words
    assert words[:1] == ["pdctl"], line
    params = ROOT_GROUP.commands[words[1]].params
    options = {opt: p for p in params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}
    arguments = sum(1 for p in params if not any(o.startswith("-") for o in p.opts))
    rest, bare = words[2:], 0
    while rest:
        word = rest.pop(0)
        if not word.startswith("-"):
            bare += 1
            continue
        assert word in options, f"{line}: {word} is not an option of {words[1]}"
        if not options[word].is_flag:
            assert rest and not rest.pop(0).startswith("-"), f"{line}: {word} needs a value"
    assert bare <= arguments, f"{line}: {bare} arguments, {words[1]} takes {arguments}"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_ends_with_examples_that_parse(name: str) -> None:
    shown = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.count("Examples:") == 1
    lines = [command for command, _ in EXAMPLES[name]]
    for line in lines:
        assert line in shown.stdout  # whole, not wrapped
        if line.startswith("pdctl "):
            _parse(line)
    assert any(line.startswith(f"pdctl {name}") for line in lines)
    assert all(len(text) <= 76 for text in epilog(EXAMPLES[name]).splitlines()), name


def test_an_example_with_a_wrong_option_would_fail_the_check() -> None:
    with pytest.raises(AssertionError, match="--no-such-option is not an option of up"):
        _parse("pdctl up --no-such-option  # a typo")
    with pytest.raises(AssertionError, match="--timeout needs a value"):
        _parse("pdctl up --timeout --dry-run")
    with pytest.raises(AssertionError, match="1 arguments, status takes 0"):
        _parse("pdctl status router")


def test_up_timeout_says_its_default() -> None:
    shown = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "200"})
    assert "[default: (1800 with engine vllm, 120 with sim)]" in shown.stdout
