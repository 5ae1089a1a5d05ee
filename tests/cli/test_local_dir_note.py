"""`model.local_dir` with `engine: sim`: the simulator reads no weights and has its own tokenizer, so the directory
is ignored; the commands that check or start a deployment say so (on stderr), and where it does not exist here."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
SIM = str(ROOT / "configs" / "local-sim.yaml")


def test_validate_says_a_sim_ignores_a_missing_local_dir(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    result = CliRunner().invoke(app, ["validate", "-t", SIM, "--set", f"model.local_dir={missing}"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok local-sim:")
    assert result.stderr.strip() == (
        f"note: model.local_dir {missing} is not used with engine: sim, and {missing} does not exist: the simulator "
        "reads no weights and has its own tokenizer (`pdctl tokenizer --out DIR` writes it); with engine: vllm, "
        f"`up` needs {missing}/config.json on every engine node")


def test_an_existing_dir_is_still_said_to_be_unused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", "-t", SIM, "--set", f"model.local_dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"note: model.local_dir {tmp_path} is not used with engine: sim: the simulator")


def test_plan_json_stays_clean_and_without_local_dir_nothing_is_said(tmp_path: Path) -> None:
    noted = CliRunner().invoke(app, ["plan", "-t", SIM, "--json", "--set", f"model.local_dir={tmp_path}/x"])
    assert noted.exit_code == 0, noted.output
    assert json.loads(noted.stdout)[0]["name"] and "is not used with engine: sim" in noted.stderr
    plain = CliRunner().invoke(app, ["validate", "-t", SIM])
    assert plain.exit_code == 0 and plain.stderr == ""


def test_vllm_with_local_dir_says_nothing_of_it() -> None:
    result = CliRunner().invoke(app, ["validate", "-t", str(ROOT / "configs" / "h200-1gpu.yaml"),
                                      "--set", "model.local_dir=/data/qwen3-8b"])
    assert result.exit_code == 0, result.output
    assert "model.local_dir /data" not in result.stderr
