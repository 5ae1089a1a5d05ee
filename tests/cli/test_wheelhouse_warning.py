"""A `python.wheelhouse` that is missing or holds no wheels: `up` installs offline from it (pip --no-index), so every
install would fail on the nodes. `validate`, `plan` and `up` warn on stderr with what, where and how to fill it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
VLLM = str(ROOT / "configs" / "h200-1gpu.yaml")
SIM = str(ROOT / "configs" / "local-sim.yaml")
FILL = "(docs/cluster-guide.md, section 3), or remove python.wheelhouse to install from the package index"


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


def test_an_empty_wheelhouse_is_warned_of_at_validate(tmp_path: Path) -> None:
    (tmp_path / "README").write_text("not a wheel")
    result = CliRunner().invoke(app, ["validate", "-t", VLLM, "--set", f"python.wheelhouse={tmp_path}"])
    assert result.exit_code == 0, result.output
    assert _warnings(result.stderr) == [
        f"warning: python.wheelhouse {tmp_path} ({VLLM}) has no wheels: `up` would install vllm==0.26.0 and "
        "nixl==1.5.1 offline from it (pip --no-index), which fails on every node. `scripts/gpu/build-wheelhouse.sh "
        f"OUT` builds one in OUT/wheels, then set python.wheelhouse to it {FILL}"]


def test_a_missing_wheels_folder_names_the_build_that_fills_it(tmp_path: Path) -> None:
    missing = tmp_path / "wh" / "wheels"
    result = CliRunner().invoke(app, ["plan", "-t", SIM, "--json", "--set", f"python.wheelhouse={missing}"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["name"]  # --json stays clean: the warning is on stderr
    assert _warnings(result.stderr) == [
        f"warning: python.wheelhouse {missing} ({SIM}) does not exist on this machine: `up` stops at provisioning. "
        f"`scripts/gpu/build-wheelhouse.sh {tmp_path / 'wh'}` fills it {FILL}"]
    assert (ROOT / "scripts/gpu/build-wheelhouse.sh").exists()


def test_up_warns_before_it_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["up", "--dry-run", "-t", SIM, "--set", f"python.wheelhouse={tmp_path}",
                                      "--set", f"work_dir={tmp_path / 'work'}"])
    assert _warnings(result.stderr)[0].startswith(f"warning: python.wheelhouse {tmp_path} ({SIM}) has no wheels: "
                                                  "`up` would install pdctl's dependencies offline")


def test_a_wheelhouse_with_wheels_or_none_at_all_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "rich-13.9.4-py3-none-any.whl").write_bytes(b"")
    filled = CliRunner().invoke(app, ["validate", "-t", SIM, "--set", f"python.wheelhouse={tmp_path}"])
    assert filled.exit_code == 0 and filled.stderr == ""
    unset = CliRunner().invoke(app, ["validate", "-t", SIM])
    assert unset.exit_code == 0 and unset.stderr == ""
