"""`pdctl up --dry-run` over real sshd (network namespaces): after `up` has provisioned and started everything,
the dry run finds no change on any host; a host that does not answer is reported as `status` reports it."""

from __future__ import annotations

import io
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

import pdctl
from pdctl.cli import app
from pdctl.lifecycle import down
from pdctl.lifecycle.bringup.provision import OPERATIONS
from pdctl.remote.local import LocalTransport
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import load
from tests.conftest import free_port
from tests.lifecycle.conftest import MakeTopo, dry_run
from tests.lifecycle.test_ssh import _nodes
from tests.support.netns import SshLab
from tests.support.venvs import system_site_env

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def _topology(lab: SshLab, tmp: Path) -> dict[str, Any]:
    """Router on h1, prefill on h2, decode on h3; each node its own venv and work_dir (one shared filesystem)."""
    nodes = [{"name": h.node, "address": h.address, "ssh_alias": h.node, "transport": "ssh",
              "venv": str(tmp / h.node / "venv"), "work_dir": str(tmp / h.node / "work")} for h in lab.hosts]
    return {
        "name": f"dry-ssh-{uuid.uuid4().hex[:8]}",
        "engine": "sim",
        "nodes": nodes,
        "model": {"id": "Qwen/Qwen3-32B", "served_name": "Qwen", "block_size": 16},
        "prefill": [{"node": "h2", "port": free_port(), "side_channel_port": free_port(), "prefix_caching": False}],
        "decode": [{"node": "h3", "port": free_port(), "side_channel_port": free_port()}],
        "router": {"node": "h1", "port": free_port()},
        "sim": {"speed": 200, "num_blocks": 4000},
        "python": {"venv": str(tmp / "shared-venv"), "system_site_packages": True},
        "work_dir": str(tmp / "shared-work"),
        "env": {"all": system_site_env(tmp / "userbase")},  # the engines see pdctl's dependencies
    }


def test_up_then_dry_run_finds_no_change_on_any_host(
    lab: SshLab, tmp_path: Path, pdctl_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _topology(lab, tmp_path)
    topo_file = tmp_path / "topo.yaml"
    topo_file.write_text(yaml.safe_dump(data))
    # `python3` on the hosts is this interpreter, whose site-packages the venvs see as the system's
    layout = {"*": {"path": [str(Path(sys.executable).parent)], "env": data["env"]["all"]}}
    (tmp_path / "layout.json").write_text(json.dumps(layout))
    monkeypatch.setenv("PDCTL_HOST_LAYOUT", str(tmp_path / "layout.json"))
    monkeypatch.setenv("PDCTL_SSH_CONFIG", str(lab.ssh_config()))
    monkeypatch.setenv("PDCTL_KNOWN_HOSTS", str(lab.known_hosts()))
    runner = CliRunner()
    try:
        first = dry_run(topo_file)
        print(first.stdout)
        assert first.stdout.splitlines()[:12] == [
            "h1: 4 changes",
            "  efa.installer: no change (efa.required is false)",
            f"  python.venv: would create venv {tmp_path}/h1/venv",
            "  python.wheelhouse: no change (no python.wheelhouse: packages come from the index)",
            "  python.packages: no change (no packages to install here)",
            f"  pdctl.ship: would upload pdctl-{pdctl.__version__}-py3-none-any.whl",
            "  vllm.compat: no change (no vLLM engine on this node)",
            "  model.download: no change (no vLLM engine on this node)",
            f"  engine key: would write {tmp_path}/h1/work/{data['name']}/engine.key",
            "  router: would start",
            "h2: 4 changes",
            "  efa.installer: no change (efa.required is false)",
        ]
        assert first.stdout.splitlines()[-2:] == [
            "provisioning shows each operation's first change; more steps may follow it",
            "dry run: 12 changes, nothing changed",
        ]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("h")] == [], "the dry run made nothing"
        assert not pdctl_home.exists()

        started = runner.invoke(app, ["up", "-t", str(topo_file)])
        assert started.exit_code == 0, started.output
        assert "turn 2 hit" in started.stderr

        again = dry_run(topo_file)
        print(again.stdout)
        assert again.stdout.splitlines() == [
            "h1: no changes",
            "  router: running, left as it is",
            "h2: no changes",
            "  prefill-0: running, left as it is",
            "h3: no changes",
            "  decode-0: running, left as it is",
            "provisioning: not needed, nothing would start",
            "dry run: no changes",
        ]

        # doctor previews provisioning on the same path: every operation on every host has nothing to do
        doc = runner.invoke(app, ["doctor", "-t", str(topo_file), "--json"])
        report = json.loads(doc.stdout)
        ops = {h["node"]: {c["name"]: c["value"] for c in h["checks"] if c["name"] in dict(OPERATIONS)}
               for h in report["hosts"]}
        assert set(ops) == {"h1", "h2", "h3"}
        for node, values in ops.items():
            assert list(values) == [name for name, _ in OPERATIONS], node
            assert all(v.startswith("no change") for v in values.values()), (node, values)
    finally:
        ssh = SshOptions(ssh_config=lab.ssh_config(), known_hosts=lab.known_hosts())
        down(load(topo_file), Console(file=io.StringIO()), ssh=ssh, timeout=5)
    assert LocalTransport().find_by_marker(data["name"]) == []


def test_dry_run_reports_a_host_that_does_not_answer(make_topo: MakeTopo, lab: SshLab, node_venv: str,
                                                     tmp_path: Path) -> None:
    dead = free_port()
    topo = make_topo(nodes=_nodes(lab, dead_port=dead), python_venv=node_venv, placement=("h2", "h3", "h1"))
    args = ["--ssh-config", str(lab.ssh_config()), "--known-hosts", str(lab.known_hosts())]
    result = dry_run(tmp_path / f"{topo.name}.yaml", *args, exit_code=1)
    assert result.stdout.splitlines() == [
        "h1: 1 change",
        "  router: would start",
        "h2: 1 change",
        "  prefill-0: would start",
        f"unreachable h3: h3: unreachable: root@{lab.hosts[2].address}:{dead}: connection refused",
        "  hint: is the host up and sshd running?",
        "  decode-0: unknown (its host did not answer)",
        "provisioning and preflight: not checked while a host is unreachable",
        "dry run: 2 changes on the hosts that answered; plan unknown on h3 (unreachable); nothing changed",
    ]
    assert LocalTransport().find_by_marker(topo.name) == []
