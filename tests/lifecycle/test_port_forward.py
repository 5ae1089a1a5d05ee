"""`port-forward` refuses a deployment that is not up (the tunnel itself is tested behind a bastion in
test_private.py)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.plan import plan
from tests.lifecycle.conftest import MakeTopo


def test_port_forward_to_a_deployment_that_is_not_up(make_topo: MakeTopo, tmp_path: Path) -> None:
    topo = make_topo()
    result = CliRunner().invoke(app, ["port-forward", "-t", str(tmp_path / f"{topo.name}.yaml"), "--port", "0"])
    router = next(s for s in plan(topo) if s.role == "router")
    assert result.exit_code == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"Error: {topo.name} is not up: the router at {router.url} on local does not answer (")
    file = tmp_path / f"{topo.name}.yaml"
    assert f"hint: start it with `pdctl up -t {file}`, or see `pdctl status -t {file}`" in result.stderr
