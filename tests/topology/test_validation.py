"""Every invalid topology the foundation issue lists: the message names file, line and key; exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app

runner = CliRunner()

VALID = """\
name: demo
engine: sim
nodes:
  - name: a
    address: 127.0.0.1
    transport: local
    gpus: 2
model:
  id: Qwen/Qwen3-32B
  block_size: 16
prefill:
  - node: a
    gpus: [0]
    port: 8100
    side_channel_port: 5600
decode:
  - node: a
    gpus: [1]
    port: 8200
    side_channel_port: 5601
router:
  node: a
  port: 8000
python:
  venv: null
"""


def validate(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["validate", "-t", str(path)])
    return result.exit_code, result.output


def test_valid_file_passes(tmp_path: Path) -> None:
    code, output = validate(tmp_path, VALID)
    assert code == 0, output
    assert "ok demo: 1 prefill, 1 decode" in output


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "  block_size: 16",
            "  block_sise: 16",
            "topo.yaml:10: model.block_sise: unknown key (did you mean `block_size`?)",
        ),
        (
            "  port: 8000\n",
            "  port: eight-thousand\n",
            "topo.yaml:23: router.port: Input should be a valid integer",
        ),
        (
            "    port: 8200\n",
            "    port: 8100\n",
            "topo.yaml:19: decode[0].port: port 8100 on node `a` is already used by prefill[0].port",
        ),
        (
            "    side_channel_port: 5601",
            "    side_channel_port: 5600",
            "topo.yaml:20: decode[0].side_channel_port: port 5600 on node `a` is already used by "
            "prefill[0].side_channel_port (base 5600 + rank 0)",
        ),
        (
            "    gpus: [1]",
            "    gpus: [0]",
            "topo.yaml:18: decode[0].gpus: GPU 0 of node `a` is already given to prefill[0]",
        ),
        (
            "    gpus: [1]",
            "    gpus: [2]",
            "topo.yaml:18: decode[0].gpus: GPU 2 does not exist: node `a` has 2 (use ids 0..1)",
        ),
        (
            "  port: 8000\n",
            "  port: 8000\n  handle_ttl: 480\n",
            "topo.yaml:24: router.handle_ttl: handle_ttl 480s is not below decoder_kv_blocks_ttl 480s",
        ),
        (
            "  - node: a\n    gpus: [1]",
            "  - node: b\n    gpus: [1]",
            "topo.yaml:17: decode[0].node: no node named `b`",
        ),
    ],
)
def test_invalid_field(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in VALID
    code, output = validate(tmp_path, VALID.replace(old, new, 1))
    assert code == 2, output
    assert expected in " ".join(output.split()), output
    assert "Traceback" not in output


def test_tp_larger_than_gpus(tmp_path: Path) -> None:
    text = VALID.replace("engine: sim", "engine: vllm").replace("    gpus: [0]\n", "    gpus: [0]\n    tp: 2\n")
    code, output = validate(tmp_path, text)
    assert code == 2
    assert "topo.yaml:14: prefill[0].tp: tp=2 x data_parallel_size=1 needs 2 GPUs but 1 are given" in output


def test_overlapping_side_channel_ranges_with_data_parallel(tmp_path: Path) -> None:
    text = VALID.replace("    side_channel_port: 5600\n", "    side_channel_port: 5600\n    data_parallel_size: 2\n")
    code, output = validate(tmp_path, text)
    assert code == 2
    assert "decode[0].side_channel_port: port 5601 on node `a` is already used by prefill[0].side_channel_port "\
        "(base 5600 + rank 1)" in " ".join(output.split())
    assert "NIXL listens on side_channel_port + data-parallel rank" in " ".join(output.split())


def test_bidirectional_must_match(tmp_path: Path) -> None:
    text = VALID.replace("    side_channel_port: 5600\n",
                         "    side_channel_port: 5600\n    connector:\n      bidirectional_kv_xfer: false\n")
    code, output = validate(tmp_path, text)
    assert code == 2
    assert "topo.yaml:17: prefill[0].connector.bidirectional_kv_xfer: bidirectional_kv_xfer is False here "\
        "but True on decode[0] (set bidirectional_kv_xfer the same on prefill and decode)" in " ".join(output.split())


@pytest.mark.parametrize(
    ("override", "key", "shown"),
    [
        ("model:\n      block_size: 64", "block_size", "model block_size 64 here but 16 on decode[0]"),
        ("model:\n      dtype: float16", "dtype", "model dtype 'float16' here but 'bfloat16' on decode[0]"),
        ("model:\n      id: other/model", "id", "model id 'other/model' here but 'Qwen/Qwen3-32B' on decode[0]"),
    ],
)
def test_prefill_and_decode_must_serve_the_same_model(tmp_path: Path, override: str, key: str, shown: str) -> None:
    text = VALID.replace("    side_channel_port: 5600\n", f"    side_channel_port: 5600\n    {override}\n")
    code, output = validate(tmp_path, text)
    assert code == 2
    assert f"topo.yaml:17: prefill[0].model.{key}: {shown}" in " ".join(output.split())


def test_empty_file(tmp_path: Path) -> None:
    code, output = validate(tmp_path, "\n# nothing here\n")
    assert code == 2
    assert "topo.yaml: the file is empty (start from configs/local-sim.yaml)" in output


def test_yaml_syntax_error(tmp_path: Path) -> None:
    code, output = validate(tmp_path, VALID.replace("  port: 8000", "  port: [8000"))
    assert code == 2
    assert "topo.yaml:" in output and "YAML syntax error" in output
    assert "Traceback" not in output


def test_missing_file(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", "-t", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml: file not found" in result.output


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = VALID.replace("  block_size: 16", "  blok_size: 16").replace("    port: 8200", "    port: 8100")
    code, output = validate(tmp_path, text)
    assert code == 2
    assert "unknown key" in output
    # schema errors stop before cross-field checks, so the two kinds arrive in two runs; both name their line
    text = VALID.replace("    port: 8200", "    port: 8100").replace("  port: 8000", "  port: 8100")
    code, output = validate(tmp_path, text)
    assert "2 problems" in output


def test_no_topology_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PDCTL_TOPOLOGY", raising=False)
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 2
    assert "no topology given" in result.output


def test_topology_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(VALID)
    monkeypatch.setenv("PDCTL_TOPOLOGY", str(path))
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 0, result.output


def test_override_sets_a_nested_key(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(VALID)
    result = runner.invoke(app, ["plan", "--json", "-t", str(path), "--set", "prefill[*].prefix_caching=true",
                                 "--set", "connector.bidirectional_kv_xfer=false"])
    assert result.exit_code == 0, result.output
    assert "--no-enable-prefix-caching" not in result.output
    assert '\\"bidirectional_kv_xfer\\":false' in result.output
