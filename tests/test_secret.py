"""Secrets render as *** in `plan` and `plan --json`; only `reveal()` gives the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.secret import MASK, Secret, is_secret_name, mark, scrub

runner = CliRunner()
TOKEN = "hf_sekrit_0123456789"

TOPO = f"""\
name: demo
engine: sim
nodes:
  - {{name: a, transport: local}}
model:
  id: m/m
prefill:
  - {{node: a, port: 8100, side_channel_port: 5600}}
decode:
  - {{node: a, port: 8200, side_channel_port: 5601}}
router:
  node: a
  api_key_env: ROUTER_AUTH
env:
  all: {{HF_TOKEN: {TOKEN}, NCCL_DEBUG: INFO}}
  decode: {{DB_PASSWORD: pw-{TOKEN}, MY_THING: thing-{TOKEN}}}
  router: {{ROUTER_AUTH: key-{TOKEN}}}
  secret: [MY_THING]
python:
  venv: null
"""


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "API_KEY", "AWS_SESSION_TOKEN",
                                  "DB_PASSWORD", "PGPASSWORD", "MY_SECRET", "GOOGLE_APPLICATION_CREDENTIALS"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["NCCL_DEBUG", "HF_HOME", "CUDA_VISIBLE_DEVICES", "PDCTL_DEPLOYMENT", "KEYBOARD"])
def test_ordinary_names(name: str) -> None:
    assert not is_secret_name(name)


def test_a_secret_has_no_other_string_form() -> None:
    s = Secret(TOKEN)
    assert (str(s), repr(s), f"{s}", f"{s:>30}".strip()) == (MASK, "Secret('***')", MASK, MASK)
    assert s.reveal() == TOKEN
    assert mark({"HF_TOKEN": TOKEN, "X": "1"}) == {"HF_TOKEN": Secret(TOKEN), "X": "1"}
    assert scrub(f"a {TOKEN} b", [TOKEN]) == "a *** b"


def test_plan_text_and_json_mask_secrets(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(TOPO)
    text = runner.invoke(app, ["plan", "-t", str(path)], terminal_width=400)
    assert text.exit_code == 0, text.output
    assert TOKEN not in text.output
    assert "'HF_TOKEN=***'" in text.output and "'DB_PASSWORD=***'" in text.output
    assert "'MY_THING=***'" in text.output and "'ROUTER_AUTH=***'" in text.output
    assert "NCCL_DEBUG=INFO" in text.output
    as_json = runner.invoke(app, ["plan", "-t", str(path), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert TOKEN not in as_json.output
    specs = {s["name"]: s for s in json.loads(as_json.output)}
    assert specs["decode-0"]["env"]["HF_TOKEN"] == MASK
    assert specs["decode-0"]["env"]["MY_THING"] == MASK
    assert specs["router"]["env"]["ROUTER_AUTH"] == MASK
    assert specs["prefill-0"]["env"]["NCCL_DEBUG"] == "INFO"


def test_the_api_key_header_is_built_in_one_place() -> None:
    from pdctl.secret import bearer

    assert bearer("k-123") == {"Authorization": "Bearer k-123"}
    assert bearer(None) == {} and bearer("") == {}
