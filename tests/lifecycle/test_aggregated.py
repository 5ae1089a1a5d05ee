"""`mode: aggregated` through the lifecycle: up starts the one engine and smoke-tests it directly, status shows it
without a router, down stops it (simulated engines)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.remote.local import LocalTransport

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
