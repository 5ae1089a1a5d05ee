"""Shell completion is typer's own (`pdctl --install-completion`): the console script answers completion requests,
and `--help` shows examples, completion among them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app

PDCTL = Path(sys.executable).parent / "pdctl"


def _complete(words: str) -> list[str]:
    env = {**os.environ, "_PDCTL_COMPLETE": "complete_bash", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - 1)}
    done = subprocess.run([str(PDCTL)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_commands_and_options_complete() -> None:
    assert _complete("pdctl st") == ["status"]
    assert _complete("pdctl up --dr") == ["--dry-run"]
    assert "port-forward" in _complete("pdctl p")


def test_help_has_examples_and_the_completion_options() -> None:
    shown = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["--help"])
    assert shown.exit_code == 0
    assert "--install-completion" in shown.stdout and "--show-completion" in shown.stdout
    assert "pdctl --install-completion          # tab completion for your shell (bash, zsh, fish)" in shown.stdout
    assert "pdctl init --example local-sim      # write ./pdctl.yaml" in shown.stdout
