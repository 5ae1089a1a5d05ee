"""`pdctl up` with engines added and removed under load: the router learns them from its members file (SIGHUP),
a removed engine is drained before it stops, and nothing that did not change is restarted. Real processes: the
simulator (simulated 1P1D -> 2P2D -> 1P1D), the router, HTTP on loopback."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from rich.console import Console

from pdctl.lifecycle import UpOptions, up
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.remote.local import LocalTransport
from pdctl.router.wire import RouterStats
from pdctl.state import StateStore
from pdctl.topology import load
from tests.conftest import free_port
from tests.lifecycle.conftest import dry_run
from tests.support.load import Load, corrupt_reuses
from tests.support.sim_topology import sim_yaml

pytestmark = pytest.mark.slow


def _yaml(name: str, work: Path, ports: dict[str, int], n: int) -> str:
    def pairs(role: str) -> list[tuple[int, int]]:
        return [(ports[f"{role}{i}"], ports[f"{role}{i}s"]) for i in range(n)]

    return sim_yaml(name, work, pairs("p"), pairs("d"), f"port: {ports['r']}")


def _processes(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith(("  decode-", "  prefill-", "  router"))]


def _pids(name: str) -> dict[str, int]:
    state = StateStore(name).load()
    assert state is not None
    return {n: r.pid for n, r in state.processes.items()}


def _stats(url: str) -> RouterStats:
    return RouterStats.from_json(httpx.get(f"{url}/stats", timeout=5).json())


def test_scale_out_and_back_under_load(tmp_path: Path, pdctl_home: Path, console: Console) -> None:
    name = "h30-scale"
    ports = {k: free_port() for k in ("p0", "p0s", "d0", "d0s", "p1", "p1s", "d1", "d1s", "r")}
    small, big = tmp_path / "small.yaml", tmp_path / "big.yaml"
    small.write_text(_yaml(name, tmp_path / "work", ports, 1))
    big.write_text(_yaml(name, tmp_path / "work", ports, 2))
    topo1, topo2 = load(small), load(big)
    try:
        dep = up(topo1, console)
        before = _pids(name)
        key = read_key(LocalTransport(), topo1, "local")
        assert key
        engines2 = [f"http://127.0.0.1:{ports[k]}" for k in ("p0", "d0", "p1", "d1")]

        plan_out = _processes(dry_run(big).stdout)
        assert plan_out[:4] == [
            "  decode-0: running, left as it is",
            "  decode-1: would start",
            "  prefill-0: running, left as it is",
            "  prefill-1: would start",
        ]
        assert plan_out[4] == "  router: running, would reload its members (+decode-1 +prefill-1; SIGHUP, no restart)"

        with Load(dep.router_url, streams=4) as load_:
            load_.wait_requests(20)
            out = up(topo2, console, UpOptions(smoke=False))
            assert sorted(out.started) == ["decode-1", "prefill-1"]
            after = _pids(name)
            assert {n: after[n] for n in before} == before  # nothing that did not change restarted
            stats = _stats(dep.router_url)
            assert sorted(u.url for u in (*stats.prefill, *stats.decode)) == sorted(engines2)
            load_.wait_requests(40)
            served = {u.url: u for u in _stats(dep.router_url).decode}
            corrupt_big = corrupt_reuses(engines2, key)

            shrink = _processes(dry_run(small).stdout)
            assert "  router: running, would reload its members (-decode-1 -prefill-1; SIGHUP, no restart)" in shrink
            assert ("  decode-1: would stop (not in the topology: drained first (no new turns, in-flight ones "
                    "finish, its handles released))") in shrink
            back = up(topo1, console, UpOptions(smoke=False))
            assert back.started == [] and sorted(back.changed) == ["decode-1 removed", "prefill-1 removed"]
            load_.wait_requests(20)
            tally = load_.stop()
        assert _pids(name) == before
        stats = _stats(dep.router_url)
        assert [u.url for u in stats.decode] == [engines2[1]] and [u.url for u in stats.prefill] == [engines2[0]]
        assert served[engines2[3]].outstanding >= 0  # decode-1 took part while it was a member
        assert stats.releases.get("drained", 0) >= 1  # decode-1's handles were released before it stopped
        assert not [p for p in LocalTransport().find_by_marker(name) if p.process in ("decode-1", "prefill-1")]
        assert tally.failed == [], tally.failed
        assert tally.ok >= 80 and tally.hit_rate > 0.5, (tally.ok, tally.reuse)
        assert corrupt_big == 0 and corrupt_reuses(engines2[:2], key) == 0
    finally:
        from pdctl.lifecycle import down

        down(topo2, console)
        down(topo1, console)


def test_rolling_restart_of_every_engine_under_load(tmp_path: Path, pdctl_home: Path, console: Console) -> None:
    name = "h30-rolling"
    ports = {k: free_port() for k in ("p0", "p0s", "d0", "d0s", "p1", "p1s", "d1", "d1s", "r")}
    path = tmp_path / "topo.yaml"
    path.write_text(_yaml(name, tmp_path / "work", ports, 2))
    topo = load(path)
    try:
        dep = up(topo, console, UpOptions(smoke=False))
        before = _pids(name)
        key = read_key(LocalTransport(), topo, "local")
        assert key
        plan_out = _processes(dry_run(path, "--restart", "--rolling").stdout)
        assert plan_out == [
            *(f"  {n}: would restart (--restart --rolling: drained first, then restarted alone, the others serving)"
              for n in ("decode-0", "decode-1", "prefill-0", "prefill-1")),
            "  router: running, left as it is",
        ]
        with Load(dep.router_url, streams=4) as load_:
            load_.wait_requests(20)
            out = up(topo, console, UpOptions(restart=True, rolling=True, smoke=False))
            load_.wait_requests(20)
            tally = load_.stop()
        after = _pids(name)
        assert sorted(out.changed) == [f"{n} replaced" for n in ("decode-0", "decode-1", "prefill-0", "prefill-1")]
        assert after["router"] == before["router"]
        assert all(after[n] != before[n] for n in before if n != "router")
        assert tally.failed == [], tally.failed  # every engine drained before it stopped: nothing was cut
        assert tally.ok >= 40
        urls = [f"http://127.0.0.1:{ports[k]}" for k in ("p0", "d0", "p1", "d1")]
        assert corrupt_reuses(urls, key) == 0
        stats = _stats(dep.router_url)
        assert not any(u.draining for u in (*stats.prefill, *stats.decode)) and len(stats.decode) == 2
    finally:
        from pdctl.lifecycle import down

        down(topo, console)


def test_a_changed_router_setting_restarts_the_router_alone(tmp_path: Path, pdctl_home: Path,
                                                            console: Console) -> None:
    ports = {k: free_port() for k in ("p0", "p0s", "d0", "d0s", "r")}
    path = tmp_path / "topo.yaml"
    path.write_text(_yaml("h30-setting", tmp_path / "work", ports, 1))
    topo = load(path)
    try:
        up(topo, console, UpOptions(smoke=False))
        before = _pids(topo.name)
        out = up(load(path, ["router.handle_ttl=400"]), console)
        after = _pids(topo.name)
        assert out.changed == ["router restarted"] and out.started == []
        assert after["router"] != before["router"]
        assert {n: after[n] for n in ("decode-0", "prefill-0")} == {n: before[n] for n in ("decode-0", "prefill-0")}
        assert out.smoke is not None and out.smoke.turn2.outcome == "hit"
    finally:
        from pdctl.lifecycle import down

        down(topo, console)
