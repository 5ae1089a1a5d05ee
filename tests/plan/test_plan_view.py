"""`pdctl plan` prints each process as a line to paste on its node: `~/` paths are left for that shell to expand
(a quoted `'~/x'` would be a directory literally named `~`)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.plan import plan
from pdctl.plan_view import shell_line, shell_word
from pdctl.topology import load

ROOT = Path(__file__).resolve().parents[2]
TOPO = ROOT / "configs" / "local-sim.yaml"


def test_plan_leaves_home_paths_bare() -> None:
    result = CliRunner().invoke(app, ["plan", "-t", str(TOPO)])
    assert result.exit_code == 0, result.output
    router = next(line for line in result.stdout.splitlines() if " -m pdctl.router serve " in line)
    assert " --members-file ~/.pdctl/local-sim/router-members.json " in router
    assert "'~" not in result.stdout
    assert 'VLLM_API_KEY="$(cat ~/.pdctl/local-sim/engine.key)"' in result.stdout


def test_a_pasted_plan_line_expands_home_and_reads_the_key(tmp_path: Path) -> None:
    """Each process's line, its program swapped for one that prints what it got, run by a real shell."""
    home = tmp_path / "home"
    (home / ".pdctl" / "local-sim").mkdir(parents=True)
    (home / ".pdctl" / "local-sim" / "engine.key").write_text("k3y")
    dump = tmp_path / "dump"
    dump.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\necho "key=$VLLM_API_KEY"\n')
    dump.chmod(0o755)
    for spec in plan(load(TOPO)):
        line = shell_line(dataclasses.replace(spec, argv=(str(dump), *spec.argv[1:])))
        got = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True,
                             env={**os.environ, "HOME": str(home)}).stdout.splitlines()
        homed = [a for a in spec.argv[1:] if a.startswith("~/")]
        assert homed or spec.secret_env, spec.name
        assert [a for a in got if a.startswith(str(home))] == [str(home) + a[1:] for a in homed], spec.name
        assert ("key=k3y" in got) == bool(spec.secret_env), spec.name


def test_odd_characters_after_the_home_are_still_quoted() -> None:
    assert shell_word("~/my dir/$x") == "~/'my dir/$x'"
    assert shell_word("~") == "~" and shell_word("~/") == "~/"
    assert shell_word("a~/b") == "'a~/b'" and shell_word("~user/x") == "'~user/x'"
