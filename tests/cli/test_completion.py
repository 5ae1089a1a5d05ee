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
ROOT = Path(__file__).resolve().parents[2]
SIM = str(ROOT / "configs" / "local-sim.yaml")


def _complete(words: str, cwd: Path | None = None) -> list[str]:
    """What bash completion offers for `words` (ending in a space: a new, empty word)."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    env = {**os.environ, "_PDCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    done = subprocess.run([str(PDCTL)], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)
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
    assert "pdctl --install-completion  # tab completion (bash, zsh, fish)" in shown.stdout
    assert "pdctl init --example local-sim  # write ./pdctl.yaml" in shown.stdout


def test_example_names_complete() -> None:
    assert _complete("pdctl init --example local-s") == ["local-sim"]
    assert set(_complete("pdctl init -e ")) == {p.stem for p in (ROOT / "configs").glob("*.yaml")}


def test_process_names_of_the_topology_complete(tmp_path: Path) -> None:
    two = str(ROOT / "configs" / "p5en-2p2d.yaml")
    assert _complete(f"pdctl logs -t {two} pre") == ["prefill-0", "prefill-1"]
    assert _complete(f"pdctl logs -t {SIM} ") == ["decode-0", "prefill-0", "router"]
    (tmp_path / "pdctl.yaml").write_text((ROOT / "configs" / "local-sim.yaml").read_text())
    assert _complete("pdctl logs r", cwd=tmp_path) == ["router"]  # ./pdctl.yaml, as the command itself reads


def test_a_topology_that_does_not_load_completes_nothing(tmp_path: Path) -> None:
    assert _complete(f"pdctl logs -t {tmp_path}/missing.yaml ") == []
    assert _complete("pdctl logs ", cwd=tmp_path) == []


def test_option_choices_complete() -> None:
    assert _complete("pdctl bench --profile ") == ["quick", "full", "agent", "evict"]
    assert _complete("pdctl bench --api c") == ["chat", "completions"]
    assert _complete("pdctl bench --client r") == ["router-node"]
