"""`pdctl init`: the shipped examples come from the package, are listed, and are written without clobbering."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.examples import examples

ROOT = Path(__file__).resolve().parents[2]


def test_the_checkout_configs_are_the_package_examples() -> None:
    names = {e.name for e in examples()}
    assert {"local-sim", "p5en-1p1d", "p5en-2p2d", "h200x2-local"} <= names
    assert names == {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    assert (ROOT / "configs").resolve() == (ROOT / "pdctl" / "configs").resolve()


def test_no_arguments_lists_the_examples_a_line_each() -> None:
    result = CliRunner().invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(examples())
    width = max(len(e.name) for e in examples()) + 2  # names padded to the longest one
    assert f"{'local-sim':<{width}}Everything on this machine, no GPU: simulated prefill and decode engines" in lines
    assert result.stderr.strip() == "write one with: pdctl init --example NAME [-o FILE]"


def test_writes_pdctl_yaml_that_validate_reads_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PDCTL_TOPOLOGY", raising=False)
    result = CliRunner().invoke(app, ["init", "--example", "local-sim"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "next: pdctl validate"
    assert (tmp_path / "pdctl.yaml").read_text() == (ROOT / "configs" / "local-sim.yaml").read_text()
    checked = CliRunner().invoke(app, ["validate"])
    assert checked.exit_code == 0, checked.output
    assert checked.stdout.startswith("ok local-sim:")


def test_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("keep me\n")
    result = CliRunner().invoke(app, ["init", "--example", "p5en-1p1d", "-o", str(target)])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"Error: {target} already exists",
        "hint: pass --force to overwrite it, or -o FILE to write elsewhere",
    ]
    assert target.read_text() == "keep me\n"
    forced = CliRunner().invoke(app, ["init", "--example", "p5en-1p1d", "-o", str(target), "--force"])
    assert forced.exit_code == 0, forced.output
    assert target.read_text().startswith("# The seed deployment")


def test_an_output_file_needs_an_example(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["init", "-o", str(tmp_path / "x.yaml")])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: -o/--force need --example NAME",
        "hint: `pdctl init` lists the examples",
    ]
    assert not (tmp_path / "x.yaml").exists()


def test_unknown_example_suggests_the_nearest() -> None:
    result = CliRunner().invoke(app, ["init", "--example", "local-sin"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0] == "Error: unknown example 'local-sin' (did you mean 'local-sim'?)"
