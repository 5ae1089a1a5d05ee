"""Topology values that reach a shell on a host are refused by `pdctl validate`, with the field and its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from tests.topology.minimal import MINIMAL

runner = CliRunner()

BASE = MINIMAL


def validate(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["validate", "-t", str(path)])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            'efa:\n  installer_version: "1.47.0;touch /tmp/x;"\n',
            "topo.yaml:16: efa.installer_version: must be a version like 1.47.0 (got '1.47.0;touch /tmp/x;')",
        ),
        (
            "env:\n  all:\n    '-S sh -c \"touch /tmp/y\" #': '1'\n",
            "topo.yaml:17: env.all: key '-S sh -c \"touch /tmp/y\" #' must be an environment variable name "
            "matching ^[A-Za-z_][A-Za-z0-9_]*$",
        ),
        (
            "env:\n  decode:\n    'X;touch /tmp/z': '1'\n",
            "topo.yaml:17: env.decode: key 'X;touch /tmp/z' must be an environment variable name",
        ),
        (
            'efa:\n  sha256: "0; touch /tmp/x"\n',
            "topo.yaml:16: efa.sha256: must be 64 hex digits (a sha256) (got '0; touch /tmp/x')",
        ),
        (
            'efa:\n  installer: "https://x/a.tgz;touch /tmp/x"\n',
            "topo.yaml:16: efa.installer: must be a URL or a path without spaces or shell characters",
        ),
        (
            "work_dir: ~/$(touch /tmp/x)\n",
            "topo.yaml:15: work_dir: must be a path of letters, digits, spaces and ./~+@:,=-",
        ),
        (
            "hf_home: '/data/hf`touch /tmp/x`'\n",
            "topo.yaml:15: hf_home: must be a path of letters",
        ),
        (
            "python:\n  vllm_version: '0.33.0; touch /tmp/x'\n",
            "topo.yaml:16: python.vllm_version: must be a PEP 440 version like 0.33.0",
        ),
        (
            "python:\n  packages: ['vllm && touch /tmp/x']\n",
            "topo.yaml:16: python.packages[0]: must be a pip requirement",
        ),
    ],
)
def test_shell_payload_is_refused(tmp_path: Path, extra: str, expected: str) -> None:
    text = BASE.replace("python:\n  venv: null\n", "") + extra
    if "python:" not in extra:
        text += "python:\n  venv: null\n"
    code, output = validate(tmp_path, text)
    assert code == 2, output
    assert expected in output, output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("  - name: a\n", "  - name: 'a;b'\n", "topo.yaml:4: nodes[0].name: must be letters, digits and ._-"),
        ("    transport: local\n", "    transport: local\n    address: -oProxyCommand=sh\n",
         "topo.yaml:6: nodes[0].address: must be a hostname or an IP address (got '-oProxyCommand=sh')"),
        ("    transport: local\n", "    transport: local\n    user: 'root;id'\n",
         "topo.yaml:6: nodes[0].user: must be a POSIX user name"),
        ("    transport: local\n", "    transport: local\n    venv: '/v;id'\n",
         "topo.yaml:6: nodes[0].venv: must be a path"),
        ("  id: Qwen/Qwen3-32B\n", "  id: Qwen/Qwen3-32B\n  revision: '--help'\n",
         "topo.yaml:8: model.revision: must be a commit hash, tag or branch (got '--help')"),
        ("  id: Qwen/Qwen3-32B\n", "  id: 'Qwen/x $(id)'\n", "topo.yaml:7: model.id: must be a Hugging Face id"),
        ("  port: 8000\n", "  port: 8000\n  api_key_env: 'K;id'\n",
         "topo.yaml:15: router.api_key_env: must be an environment variable name"),
        ("  port: 8000\n", "  port: true\n", "topo.yaml:14: router.port: Input should be a valid integer (got True)"),
        ("port: 8100,", "port: '8100',", "topo.yaml:9: prefill[0].port: Input should be a valid integer (got '8100')"),
    ],
)
def test_field_pattern(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in BASE
    code, output = validate(tmp_path, BASE.replace(old, new, 1))
    assert code == 2, output
    assert expected in output, output


def test_ordinary_values_still_pass(tmp_path: Path) -> None:
    text = BASE.replace("    transport: local\n", "    transport: local\n    address: ip-10-0-0-1.ec2.internal\n") + (
        "efa:\n  installer_version: 1.47.0\n  sha256: " + "ab" * 32 + "\n"
        "env:\n  all: {NCCL_DEBUG: INFO, _X1: 'two words; and $dollars'}\n"
        "extra_args:\n  decode: ['--max-num-batched-tokens', '8192']\n"
        "work_dir: ~/pdctl work\n"
    )
    text = text.replace("python:\n  venv: null\n", "") + (
        "python:\n  venv: null\n  vllm_version: 0.33.0+cu128\n  packages: ['flashinfer-python==0.2.5', "
        "'pkg @ https://example.invalid/pkg.whl ; python_version > \"3.8\"']\n"
    )
    code, output = validate(tmp_path, text)
    assert code == 0, output
