"""`pdctl up --dry-run` on this machine: every change `up` would make, per host, and nothing changed."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from pathlib import Path

import pytest
from rich.console import Console

import pdctl
from pdctl.lifecycle import up
from pdctl.remote.local import LocalTransport
from pdctl.topology import load
from tests.conftest import free_port
from tests.lifecycle.conftest import MakeTopo, dry_run, topology_yaml

pytestmark = pytest.mark.slow
KEY = "PDCTL_DRY_RUN_KEY"
SECRET = "dry-run-secret-8c1f"


def _tree(root: Path) -> dict[str, str]:
    """Every path under `root` with a digest of its content (files) or its kind (directories, links)."""
    def digest(p: Path) -> str:
        if p.is_symlink():
            return "link:" + str(p.readlink())
        return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"

    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*"))}


def test_dry_run_on_a_fresh_host_lists_every_change_and_makes_none(
    tmp_path: Path, pdctl_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"dry-{uuid.uuid4().hex[:8]}"
    venv, work = tmp_path / "venv", tmp_path / "work"
    topo_file = tmp_path / f"{name}.yaml"
    topo_file.write_text(topology_yaml(
        name, work, python_venv=str(venv), router_extra=f", api_key_env: {KEY}",
        extra_yaml=f"env: {{router: {{{KEY}: {SECRET}}}}}\n",
    ))
    before = _tree(tmp_path)

    result = dry_run(topo_file)

    assert result.stdout.splitlines() == [
        "local: 6 changes",
        "  efa.installer: no change (efa.required is false)",
        f"  python.venv: would create venv {venv}",
        "  python.wheelhouse: no change (no python.wheelhouse: packages come from the index)",
        "  python.packages: no change (no packages to install here)",
        f"  pdctl.ship: would upload pdctl-{pdctl.__version__}-py3-none-any.whl",
        "  vllm.compat: no change (no vLLM engine on this node)",
        "  model.download: no change (no vLLM engine on this node)",
        f"  engine key: would write {work}/{name}/engine.key",
        "  decode-0: would start",
        "  prefill-0: would start",
        "  router: would start",
        "provisioning shows each operation's first change; more steps may follow it",
        "dry run: 6 changes, nothing changed",
    ]
    assert SECRET not in result.output
    assert _tree(tmp_path) == before  # no venv, nothing under work_dir, no state file or lock in PDCTL_HOME
    assert not venv.exists() and not work.exists() and not pdctl_home.exists()
    assert LocalTransport().find_by_marker(name) == []


def test_after_a_changed_setting_only_that_process_would_restart(
    make_topo: MakeTopo, console: Console, tmp_path: Path
) -> None:
    topo = make_topo()
    up(topo, console)
    topo_file = str(tmp_path / f"{topo.name}.yaml")
    assert load(Path(topo_file), ["router.handle_ttl=400"]).router.handle_ttl == 400
    pids = sorted(p.pid for p in LocalTransport().find_by_marker(topo.name))

    result = dry_run(topo_file, "--set", "router.handle_ttl=400")

    assert result.stdout.splitlines() == [
        "local: 1 change",
        "  decode-0: running, left as it is",
        "  prefill-0: running, left as it is",
        "  router: would restart (its argv changed: its in-flight requests end and the handles it holds are dropped "
        "(each conversation's next turn misses once); with router.replicas >= 2 routers restart one at a time, "
        "drained first)",
        "provisioning: not needed, nothing would start",
        "dry run: 1 change, nothing changed",
    ]
    assert sorted(p.pid for p in LocalTransport().find_by_marker(topo.name)) == pids

    converged = dry_run(topo_file)
    assert converged.stdout.splitlines() == [
        "local: no changes",
        "  decode-0: running, left as it is",
        "  prefill-0: running, left as it is",
        "  router: running, left as it is",
        "provisioning: not needed, nothing would start",
        "dry run: no changes",
    ]


def test_dry_run_with_restart_restarts_everything_and_previews_provisioning(
    make_topo: MakeTopo, console: Console, tmp_path: Path
) -> None:
    topo = make_topo()
    up(topo, console)
    result = dry_run(tmp_path / f"{topo.name}.yaml", "--restart")
    null = "python.venv is null"
    assert result.stdout.splitlines() == [
        "local: 3 changes",
        "  efa.installer: no change (efa.required is false)",
        f"  python.venv: no change ({null}: the CLI's own interpreter runs pdctl)",
        "  python.wheelhouse: no change (no python.wheelhouse: packages come from the index)",
        "  python.packages: no change (no packages to install here)",
        f"  pdctl.ship: no change ({null}: nodes run the CLI's own pdctl)",
        "  vllm.compat: no change (no vLLM engine on this node)",
        "  model.download: no change (no vLLM engine on this node)",
        "  decode-0: would restart (--restart)",
        "  prefill-0: would restart (--restart)",
        "  router: would restart (--restart)",
        "dry run: 3 changes, nothing changed",
    ]


def _comm() -> str:
    return Path("/proc/self/comm").read_text().strip()


def test_a_busy_port_is_where_up_would_stop(make_topo: MakeTopo, tmp_path: Path) -> None:
    topo = make_topo()
    port = topo.router.port
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        result = dry_run(tmp_path / f"{topo.name}.yaml", exit_code=1)
    assert result.stdout.splitlines()[-7:] == [
        f"  engine key: would write {tmp_path}/work/{topo.name}/engine.key",
        "  decode-0: would start",
        "  prefill-0: would start",
        "  router: would start",
        "up would stop here: preflight failed:",
        f"  local: port {port} needed by router is in use by pid {os.getpid()} ({_comm()})",
        "dry run: 4 changes, nothing changed",
    ]


def test_no_host_answers_so_the_plan_is_unknown(make_topo: MakeTopo, tmp_path: Path) -> None:
    """Three SSH nodes on loopback ports nothing listens on: each refused, none said to have "no changes"."""
    ports = {n: free_port() for n in ("h1", "h2", "h3")}
    nodes: list[dict[str, object]] = [{"name": n, "address": "127.0.0.1", "transport": "ssh", "port": p,
                                       "user": "root", "ssh_alias": "null"} for n, p in ports.items()]
    topo = make_topo(nodes=nodes, placement=("h2", "h3", "h1"), python_venv=str(tmp_path / "venv"))
    result = dry_run(tmp_path / f"{topo.name}.yaml", exit_code=1)
    assert result.stdout.splitlines() == [
        f"unreachable h1: h1: unreachable: root@127.0.0.1:{ports['h1']}: connection refused",
        "  hint: is the host up and sshd running?",
        "  router: unknown (its host did not answer)",
        f"unreachable h2: h2: unreachable: root@127.0.0.1:{ports['h2']}: connection refused",
        "  hint: is the host up and sshd running?",
        "  prefill-0: unknown (its host did not answer)",
        f"unreachable h3: h3: unreachable: root@127.0.0.1:{ports['h3']}: connection refused",
        "  hint: is the host up and sshd running?",
        "  decode-0: unknown (its host did not answer)",
        "provisioning and preflight: not checked while a host is unreachable",
        "dry run: plan unknown: no host answered (h1, h2, h3), so what `up` would change is unknown; nothing changed",
    ]
