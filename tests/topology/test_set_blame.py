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


def test_a_malformed_set_is_blamed_on_the_set_not_the_file() -> None:
    cases = {
        "model.block_size": "  --set model.block_size: an override must look like key.path=value "
                            "(e.g. --set model.max_num_seqs=8)",
        "prefill[5].port=1": "  --set prefill[5].port=1: prefill[5].port: no list item `5` to override",
        "model.id.x=1": "  --set model.id.x=1: model.id.x: cannot override inside `x`",
    }
    for override, line in cases.items():
        result = CliRunner().invoke(app, ["validate", "-t", str(TOPO), "--set", override])
        assert result.exit_code == 2
        assert result.stderr.splitlines()[1:] == [line, "hint: fix the --set value; `pdctl validate --set "
                                                          "KEY=VALUE` checks it"], override
    bad_yaml = CliRunner().invoke(app, ["validate", "-t", str(TOPO), "--set", "model.block_size=[1"])
    assert bad_yaml.stderr.splitlines()[1].startswith("  --set model.block_size=[1: model.block_size: the value ")


def test_problems_elsewhere_that_a_set_caused_are_blamed_on_that_set() -> None:
    """Renaming the node orphans every `node: local`: those lines are right in the file, the --set is wrong."""
    result = CliRunner().invoke(app, ["validate", "-t", str(TOPO), "--set", "model.max_num_seqs=4",
                                      "--set", "nodes[0].name=other"])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0] == "Error: invalid topology (3 problems):"
    assert sorted(lines[1:4]) == [
        f"  --set nodes[0].name=other: {key}.node: no node named `local` (nodes are: other)"
        for key in ("decode[0]", "prefill[0]", "router")]
    assert lines[4] == "hint: fix the --set value; `pdctl validate --set KEY=VALUE` checks it"
