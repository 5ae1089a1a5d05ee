"""A `model.local_dir` without a model is refused before any host changes (no venv, no vLLM installed for
nothing); `doctor` names the fix `up` needs, and `up --dry-run` fails on it even when the venv is to be made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.errors import PdctlError
from pdctl.lifecycle.bringup.provision import provision
from pdctl.plan import plan

from .support import HomeTransport, host_root, topology

FIX = ("copy the model there (scripts/make_dummy_model.py writes a random-weights one), "
       "or unset model.local_dir to download model.id")


def test_provision_refuses_a_missing_local_dir_before_any_change(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    topo = topology(
        nodes=[{"name": "a", "transport": "local"}, {"name": "b", "transport": "local"}],
        decode=[{"node": "b", "port": 18200}],
        model={"id": "Qwen/Qwen3-32B", "local_dir": str(weights)},
        python={"venv": "~/venv", "vllm_version": "0.26.0"},
    )
    roots = {n: host_root(tmp_path, n) for n in ("a", "b")}
    hosts = {n: HomeTransport(n, root / "home") for n, (root, _) in roots.items()}
    layouts = {n: layout for n, (_, layout) in roots.items()}
    console = Console(width=200, record=True, color_system=None)
    with pytest.raises(PdctlError) as refused:
        provision(topo, plan(topo), hosts, console, layouts=layouts, wheel=None)
    assert refused.value.message == (
        f"model.local_dir is missing on 2 nodes:\n  a: model.local_dir {weights} has no config.json\n"
        f"  b: model.local_dir {weights} has no config.json"
    )
    assert refused.value.hint == FIX
    for root, _ in roots.values():
        assert not (root / "home/venv").exists()  # nothing was installed
    assert "python.venv" not in console.export_text()


def _vllm_topology(tmp_path: Path) -> Path:
    data = {
        "name": "h32-weights",
        "engine": "vllm",
        "nodes": [{"name": "a", "transport": "local", "gpus": 2}],
        "model": {"id": "Qwen/Qwen3-8B", "local_dir": str(tmp_path / "model")},
        "prefill": [{"node": "a", "gpus": [0], "port": 18100, "side_channel_port": 15600}],
        "decode": [{"node": "a", "gpus": [1], "port": 18200, "side_channel_port": 15601}],
        "router": {"node": "a", "port": 18000},
        "connector": {"backend": "UCX"},
        "python": {"venv": str(tmp_path / "venv"), "vllm_version": "0.26.0"},
        "work_dir": str(tmp_path / "work"),
    }
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_doctor_names_the_fix_up_needs_for_a_missing_local_dir(tmp_path: Path, host: Path) -> None:
    result = CliRunner().invoke(app, ["doctor", "-t", str(_vllm_topology(tmp_path)), "--json"])
    assert result.exit_code == 1, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["hosts"][0]["checks"]}
    assert checks["model"] == {
        "name": "model", "status": "fail", "value": f"{tmp_path / 'model'} has no config.json",
        "fix": f"copy the model to {tmp_path / 'model'} (`pdctl up` refuses without it), or unset model.local_dir "
        "to download model.id",
    }
    # the operation's own line: a refusal that stands although the venv is still to be made
    assert checks["model.download"]["status"] == "fail"
    assert checks["model.download"]["value"] == (
        f"would fail: a: model.local_dir {tmp_path / 'model'} has no config.json"
    )


def test_dry_run_fails_on_a_missing_local_dir(tmp_path: Path, host: Path) -> None:
    result = CliRunner().invoke(app, ["up", "-t", str(_vllm_topology(tmp_path)), "--dry-run"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.stdout.split())
    assert f"model.download: would fail: a: model.local_dir {tmp_path / 'model'} has no config.json" in text
    assert "python.venv: would create venv" in text
