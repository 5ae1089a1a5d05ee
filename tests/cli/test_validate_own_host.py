"""`pdctl validate` on a shipped topology written for pdctl's own GPU host names the fields to set for another."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.examples import OWN_HOST

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("file", "name"), [("h200-1gpu", "h200-1gpu"), ("h200x2-local", "h200x2")])
def test_the_own_host_examples_name_the_fields_to_change(file: str, name: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert name in OWN_HOST
    monkeypatch.chdir(tmp_path)  # where the host's relative wheelhouse (.gpu/wh/wheels) is not
    result = CliRunner().invoke(app, ["validate", "-t", str(ROOT / "configs" / f"{file}.yaml")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok {name}:")
    warning, note = result.stderr.strip().splitlines()
    assert warning.startswith("warning: python.wheelhouse .gpu/wh/wheels (")
    assert note == (
        f"note: {name} is written for pdctl's own GPU host (docs/gpu-run.md); for yours set model.local_dir, "
        "python.venv, python.wheelhouse (docs/cluster-guide.md)")


def test_set_fields_are_no_longer_named_and_all_set_says_nothing(tmp_path: Path) -> None:
    (tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_31_x86_64.whl").write_bytes(b"")
    path = str(ROOT / "configs" / "h200-1gpu.yaml")
    some = CliRunner().invoke(app, ["validate", "-t", path, "--set", "model.local_dir=/data/qwen3-8b"])
    assert some.exit_code == 0, some.output
    assert "for yours set python.venv, python.wheelhouse (" in some.stderr
    every = CliRunner().invoke(app, ["validate", "-t", path, "--set", "model.local_dir=/data/qwen3-8b",
                                     "--set", "python.venv=/opt/venv", "--set", f"python.wheelhouse={tmp_path}"])
    assert every.exit_code == 0, every.output
    assert every.stderr == ""


def test_other_examples_get_no_note() -> None:
    result = CliRunner().invoke(app, ["validate", "-t", str(ROOT / "configs" / "local-sim.yaml")])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
