"""`pdctl observe` says where the dashboard file is: in --out, or (with --start alone) on the router's node beside
the Prometheus configuration, by its full path."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from tests.conftest import free_port
from tests.lifecycle.conftest import topology_yaml
from tests.support.netns import skip_or_fail

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


def test_observe_names_the_dashboard_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if PROMETHEUS is None:
        skip_or_fail("prometheus is required in CI", "no prometheus binary (apt-get install prometheus)")
    monkeypatch.setenv("PDCTL_HOME", str(tmp_path / "home"))
    name = f"h41obs-{uuid.uuid4().hex[:6]}"
    topo = tmp_path / f"{name}.yaml"
    topo.write_text(topology_yaml(name, tmp_path / "work"))
    runner = CliRunner()
    up = runner.invoke(app, ["up", "-t", str(topo), "--no-smoke-test"])
    assert up.exit_code == 0, up.output
    try:
        rendered = runner.invoke(app, ["observe", "-t", str(topo), "--out", str(tmp_path / "obs")])
        assert rendered.exit_code == 0, rendered.output
        assert f"grafana: import {tmp_path / 'obs' / 'pdctl-dashboard.json'} (Dashboards" in rendered.stdout
        started = runner.invoke(app, ["observe", "-t", str(topo), "--start", "--port", str(free_port()),
                                      "--prometheus-bin", PROMETHEUS])
        assert started.exit_code == 0, started.output
        board = tmp_path / "work" / name / "prometheus" / "pdctl-dashboard.json"
        assert f"grafana: import {board} on local (Dashboards" in started.stdout
        assert board.is_file()
    finally:
        down = runner.invoke(app, ["down", "-t", str(topo)])
    assert down.exit_code == 0, down.output
