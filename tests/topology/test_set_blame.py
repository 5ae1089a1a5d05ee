"""A bad `--set` value is the command line's problem: blamed on `--set KEY=VALUE`, never on a line of the file."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app

TOPO = Path(__file__).resolve().parents[2] / "configs" / "local-sim.yaml"


def test_a_bad_set_value_is_blamed_on_the_set() -> None:
    result = CliRunner().invoke(app, ["validate", "-t", str(TOPO), "--set", "model.block_size=abc"])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: invalid topology (1 problem):",
        "  --set model.block_size=abc: model.block_size: Input should be a valid integer (got 'abc')",
        "hint: fix the --set value; `pdctl validate --set KEY=VALUE` checks it",
    ]


def test_a_cross_field_problem_a_set_made_is_blamed_on_it() -> None:
    result = CliRunner().invoke(app, ["validate", "-t", str(TOPO), "--set", "router.handle_ttl=480"])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[1].startswith("  --set router.handle_ttl=480: router.handle_ttl: handle_ttl 480s is not below "), lines


def test_a_problem_of_the_file_keeps_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TOPO.read_text().replace("block_size: 16", "block_sise: 16"))
    result = CliRunner().invoke(app, ["validate", "-t", str(bad), "--set", "model.max_num_seqs=4"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1] == f"  {bad}:16: model.block_sise: unknown key (did you mean `block_size`?)"
    assert result.stderr.splitlines()[-1] == f"hint: fix the file and check it with `pdctl validate -t {bad}`"
