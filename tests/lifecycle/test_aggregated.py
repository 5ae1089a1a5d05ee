"""`mode: aggregated` through the lifecycle: up starts the one engine and smoke-tests it directly, status shows it
without a router, down stops it; with two decode instances, two engines behind the router (simulated engines)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.remote.local import LocalTransport
from tests.conftest import free_port

from .conftest import topology_yaml

pytestmark = pytest.mark.slow


def test_aggregated_up_status_down(tmp_path: Path, pdctl_home: Path) -> None:
    name = f"agg-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "topo.yaml"
    path.write_text(topology_yaml(name, tmp_path / "work", extra_yaml="mode: aggregated\n"))
    runner = CliRunner()
    try:
        up = runner.invoke(app, ["up", "-t", str(path)])
        assert up.exit_code == 0, up.output
        assert "smoke test: two turns through the engine" in up.output
        assert f"up {name}: started aggregated-0" in up.output
        status = runner.invoke(app, ["status", "-t", str(path), "--json"])
        assert status.exit_code == 0, status.output
        report = json.loads(status.stdout)
        assert [(p["name"], p["role"], p["health"]) for p in report["processes"]] == [("aggregated-0", "decode", "ok")]
        assert report["router"] is None and report["healthy"] is True
    finally:
        down = runner.invoke(app, ["down", "-t", str(path)])
    assert down.exit_code == 0, down.output
    assert LocalTransport().find_by_marker(name) == []


def test_two_aggregated_engines_behind_the_router_up_status_logs_down(tmp_path: Path, pdctl_home: Path) -> None:
    name = f"agg2-{uuid.uuid4().hex[:8]}"
    data = yaml.safe_load(topology_yaml(name, tmp_path / "work", extra_yaml="mode: aggregated\n"))
    data["decode"].append({"node": "local", "port": free_port(), "side_channel_port": free_port()})
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    runner = CliRunner()
    try:
        up = runner.invoke(app, ["up", "-t", str(path)])
        assert up.exit_code == 0, up.output
        assert "smoke test: two turns through the router" in up.output
        assert f"up {name}: started aggregated-0, aggregated-1, router" in up.output, up.output
        status = runner.invoke(app, ["status", "-t", str(path), "--json"])
        assert status.exit_code == 0, status.output
        report = json.loads(status.stdout)
        assert [(p["name"], p["role"], p["health"]) for p in report["processes"]] == [
            ("aggregated-0", "decode", "ok"), ("aggregated-1", "decode", "ok"), ("router", "router", "ok")]
        assert report["router"]["error"] is None and report["healthy"] is True
        assert report["router"]["requests_total"] >= 2  # the smoke test's two turns went through the router
        router = f"http://127.0.0.1:{data['router']['port']}"
        for n in range(4):  # new conversations: both engines serve some
            r = httpx.post(f"{router}/v1/chat/completions", timeout=30, json={
                "model": "Qwen", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {n}"}]})
            assert r.status_code == 200, r.text
        for d in data["decode"]:
            metrics = httpx.get(f"http://127.0.0.1:{d['port']}/metrics", timeout=10).text
            generated = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                            if line.startswith("vllm:generation_tokens_total"))
            assert generated > 0, d
        for d in data["decode"]:  # the engines take only the deployment's key, which the router holds
            assert httpx.post(f"http://127.0.0.1:{d['port']}/v1/completions", timeout=10,
                              json={"model": "Qwen", "prompt": "hi", "max_tokens": 1}).status_code == 401
        logs = runner.invoke(app, ["logs", "-t", str(path), "aggregated-1", "-n", "200"])
        assert logs.exit_code == 0 and "Starting vLLM API server (pdctl simulator" in logs.output, logs.output
        router_log = runner.invoke(app, ["logs", "-t", str(path), "router", "-n", "200"])
        assert "Ready: aggregated, 2 engines" in router_log.output, router_log.output
    finally:
        down = runner.invoke(app, ["down", "-t", str(path)])
    assert down.exit_code == 0, down.output
    assert LocalTransport().find_by_marker(name) == []
    again = runner.invoke(app, ["down", "-t", str(path)])
    assert again.exit_code == 0, again.output
