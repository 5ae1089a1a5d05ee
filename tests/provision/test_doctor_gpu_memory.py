"""`pdctl doctor` weighs each GPU's free memory against the gpu_memory_utilization of the instances on it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pdctl.cli import app


def _topology(tmp_path: Path, utilization: float) -> Path:
    data = {
        "name": "shared",
        "engine": "vllm",
        "nodes": [{"name": "a", "transport": "local", "gpus": 1}],
        "model": {"id": "Qwen/Qwen3-8B", "local_dir": str(tmp_path / "model"), "gpu_memory_utilization": utilization},
        "prefill": [{"node": "a", "gpus": [0], "port": 18100, "side_channel_port": 15600}],
        "decode": [{"node": "a", "gpus": [0], "port": 18200, "side_channel_port": 15601}],
        "router": {"node": "a", "port": 18000},
        "python": {"venv": str(tmp_path / "venv"), "vllm_version": "0.26.0"},
        "work_dir": str(tmp_path / "work"),
    }
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _memory_check(tmp_path: Path, utilization: float) -> dict[str, str]:
    result = CliRunner().invoke(app, ["doctor", "-t", str(_topology(tmp_path, utilization)), "--json"])
    assert result.exit_code == 1, result.output  # no venv, no model: doctor fails anyway
    checks = {c["name"]: c for c in json.loads(result.stdout)["hosts"][0]["checks"]}
    return checks["gpu 0 memory"]


def test_a_free_gpu_holds_both_instances(tmp_path: Path, host: Path) -> None:
    assert _memory_check(tmp_path, 0.45) == {
        "name": "gpu 0 memory", "status": "ok", "fix": "",
        "value": "143252 MiB free of 143771; decode[0] 0.45 + prefill[0] 0.45 = 0.9 needs 129393 MiB",
    }


def test_memory_held_by_something_else_fails_with_the_fix(tmp_path: Path, host: Path) -> None:
    (host / "fake/gpu-memory.out").write_text("0, 143771, 40000, 103252\n")
    assert _memory_check(tmp_path, 0.45) == {
        "name": "gpu 0 memory", "status": "fail",
        "value": "103252 MiB free of 143771; decode[0] 0.45 + prefill[0] 0.45 = 0.9 needs 129393 MiB",
        "fix": "free the GPU (`nvidia-smi` shows who holds it; `pdctl down` if this deployment runs) or lower "
        "model.gpu_memory_utilization",
    }
