"""`router.replicas` changed on a running deployment, applied by a plain `pdctl up` under load: 3 -> 2 -> 3
routers behind a real HAProxy (master-worker, reloaded with SIGUSR2), on simulated 2P2D engines (real processes,
HTTP on loopback). Nothing that did not change restarts: the engines, the load balancer's master and the routers
that stay keep their pids."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console

from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.remote.local import LocalTransport
from pdctl.topology import load
from tests.lifecycle.conftest import dry_run
from tests.lifecycle.test_router_replicas import _pids, free_block, replicas_yaml
from tests.support.load import Load, corrupt_reuses

pytestmark = pytest.mark.slow
RELOADS = 3  # the most load balancer reloads one test makes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")


def test_routers_scaled_down_and_up_live_under_load(tmp_path: Path, pdctl_home: Path, console: Console) -> None:
    name = "h34-scale"
    path = tmp_path / "topo.yaml"
    three = replicas_yaml(name, tmp_path / "work", replicas=3)
    two = three.replace("replicas: 3,", "replicas: 2,")
    path.write_text(three)
    topo = load(path)
    try:
        dep = up(topo, console, UpOptions(smoke=False))
        before = _pids(name)
        engines = [s.url for s in dep.specs if s.role in ("prefill", "decode")]
        with Load(dep.router_url, streams=6) as load_:
            load_.wait_requests(30)
            path.write_text(two)
            plan = dry_run(path).output
            assert "router-2: would stop (not in the topology: drained at the load balancer first" in plan, plan
            assert "lb: running, would reload the load balancer (-router-2; SIGUSR2 to its master" in plan
            for n in ("router-0", "router-1", "prefill-0", "decode-1"):
                assert f"{n}: running, left as it is" in plan, plan
            smaller = up(load(path), console, UpOptions(smoke=False))
            mid = _pids(name)
            load_.wait_requests(40)
            path.write_text(three)
            plan_up = dry_run(path).output
            assert "router-2: would start" in plan_up and "(+router-2; once the new routers answer;" in plan_up, plan_up
            bigger = up(load(path), console, UpOptions(smoke=False))
            load_.wait_requests(60)
            tally = load_.stop()
        after = _pids(name)
        assert smaller.started == [] and smaller.changed == ["load balancer reloaded (-router-2)", "router-2 removed"]
        assert "router-2" not in mid and not _alive(before["router-2"])
        assert mid == {n: p for n, p in before.items() if n != "router-2"}  # the LB's master, engines, 2 routers
        assert bigger.started == ["router-2"] and bigger.changed == ["load balancer reloaded (+router-2)"]
        assert {n: p for n, p in after.items() if n != "router-2"} == mid
        assert tally.failed == [], tally.failed
        # a reload may close each stream's idle keep-alive connection once; such a request was not read and went
        # again (tests/support/load.py, as the SDKs do); more than that would be the LB dropping requests
        assert len(tally.resent) <= 6 * RELOADS, tally.resent
        assert "router-2" in {r.router for r in tally.requests if r.start > tally.requests[-1].start - 3}
        assert corrupt_reuses(engines, read_key(LocalTransport(), topo, "local")) == 0
        assert dry_run(path).output.rstrip().endswith("dry run: no changes")
    finally:
        down(topo, console)
    assert not LocalTransport().find_by_marker(name)


def test_router_settings_and_ports_changed_one_router_at_a_time(tmp_path: Path, pdctl_home: Path,
                                                                console: Console) -> None:
    """`router.replica_port` and `router.handle_ttl` changed: each router restarted in turn (drained at HAProxy
    first), on its new port, and reloaded into HAProxy as soon as it answers; the others keep serving."""
    name = "h34-moves"
    path = tmp_path / "topo.yaml"
    text = replicas_yaml(name, tmp_path / "work", replicas=3)
    path.write_text(text)
    topo = load(path)
    try:
        dep = up(topo, console, UpOptions(smoke=False))
        before = _pids(name)
        old_port = topo.router.replica_port
        assert old_port is not None
        port = free_block(3)
        path.write_text(text.replace(f"replica_port: {old_port}", f"replica_port: {port}, handle_ttl: 400"))
        with Load(dep.router_url, streams=6) as load_:
            load_.wait_requests(30)
            plan = dry_run(path).output
            assert "router-1: would restart (its argv changed: drained at the load balancer first" in plan, plan
            assert f"lb: running, would reload the load balancer (router-0 moves to 127.0.0.1:{port} " in plan
            out = up(load(path), console, UpOptions(smoke=False))
            load_.wait_requests(40)
            tally = load_.stop()
        after = _pids(name)
        assert sorted(out.changed) == ["router-0 restarted", "router-1 restarted", "router-2 restarted"]
        assert all(after[n] != before[n] for n in ("router-0", "router-1", "router-2"))
        assert {n: after[n] for n in before if not n.startswith("router")} == {
            n: p for n, p in before.items() if not n.startswith("router")}
        assert tally.failed == [], tally.failed
        # a reload may close each stream's idle keep-alive connection once; such a request was not read and went
        # again (tests/support/load.py, as the SDKs do); more than that would be the LB dropping requests
        assert len(tally.resent) <= 6 * RELOADS, tally.resent
        cfg = (tmp_path / "work" / name / "haproxy.cfg").read_text()
        assert f"server router-2 127.0.0.1:{port + 2} " in cfg and f":{old_port}" not in cfg
    finally:
        down(topo, console)
