"""Provisioning over SSH, against test hosts in network namespaces (real sshd, real SFTP, real pip).

The namespaces share this machine's filesystem and root's home, so each node gets its own `venv` and `work_dir`
(per-node overrides): one topology-wide venv would be the same directory on both hosts. Venvs are made with
system site-packages, so pdctl's dependencies come from this interpreter's and everything installs offline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import pdctl
from pdctl.facts.base import HostLayout, gather
from pdctl.facts.host import ListeningPorts
from pdctl.lifecycle import UpOptions, down, up
from pdctl.lifecycle.bringup import doctor
from pdctl.lifecycle.bringup.provision import HostReport, contexts, provision
from pdctl.lifecycle.hosts.connect import connected
from pdctl.operations.ship import Wheel, build_wheel
from pdctl.plan import plan
from pdctl.remote.local import LocalTransport
from pdctl.remote.sshconnect import SshOptions
from pdctl.state import StateStore
from pdctl.topology import Topology
from tests.conftest import free_port
from tests.support.netns import SshLab, running_lab
from tests.support.venvs import system_site_env

from .support import FAKEBIN, host_root, make_wheel, topology

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
GOLDEN = Path(__file__).parent / "facts"
# `python3` on the hosts is this interpreter; its site-packages hold pdctl's dependencies (see system_site_env)
PYTHON_LAYOUT = HostLayout(path=(str(Path(sys.executable).parent),))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    with running_lab(tmp_path_factory.mktemp("prov-lab"), count=2) as lab:
        yield lab


@pytest.fixture(scope="module")
def ssh(lab: SshLab) -> SshOptions:
    return SshOptions(ssh_config=lab.ssh_config(), known_hosts=lab.known_hosts())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """Built once: other engineers edit pdctl's sources while tests run, and an edited tree ships again."""
    return build_wheel(tmp_path_factory.mktemp("pdctl-wheel"))


def _console() -> Console:
    return Console(width=160, record=True, force_terminal=False, color_system=None)


def _nodes(lab: SshLab, tmp: Path) -> list[dict[str, Any]]:
    return [
        {"name": h.node, "address": h.address, "ssh_alias": h.node, "transport": "ssh",
         "venv": str(tmp / h.node / "venv"), "work_dir": str(tmp / h.node / "work")}
        for h in lab.hosts
    ]


def _sim_topology(lab: SshLab, tmp: Path, wheelhouse: Path) -> Topology:
    return topology(
        name=f"prov-ssh-{uuid.uuid4().hex[:8]}",  # processes are found by this name machine-wide
        engine="sim",
        nodes=_nodes(lab, tmp),
        model={"id": "Qwen/Qwen3-32B", "served_name": "Qwen", "block_size": 16},
        prefill=[{"node": "h1", "port": free_port(), "side_channel_port": free_port(), "prefix_caching": False}],
        decode=[{"node": "h2", "port": free_port(), "side_channel_port": free_port()}],
        router={"node": "h1", "port": free_port()},
        sim={"speed": 200, "num_blocks": 4000},
        python={"venv": str(tmp / "shared-venv"), "packages": ["pdctl-probe==1.0"], "wheelhouse": str(wheelhouse),
                "system_site_packages": True},
        work_dir=str(tmp / "shared-work"),
        env={"all": system_site_env(tmp / "userbase")},  # the engines see the same "system" packages
    )


def _ops(report: HostReport) -> dict[str, bool]:
    return {r.name: bool(r.changes) for r in report.results}


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_sim_topology_over_ssh_provisions_each_node_venv_once(
    lab: SshLab, ssh: SshOptions, wheel: Wheel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PDCTL_HOME", str(tmp_path / "home"))
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "pdctl-probe", "1.0", {"pdctl_probe/__init__.py": b"VALUE = 42\n"})
    topo = _sim_topology(lab, tmp_path, wheelhouse)
    layouts = {"*": HostLayout(path=PYTHON_LAYOUT.path, env=dict(topo.env.all))}

    with connected(topo.nodes, ssh) as hosts:
        start = time.monotonic()
        first = provision(topo, plan(topo), hosts, _console(), layouts=layouts, wheel=wheel)
        print(f"first provisioning of 2 SSH hosts: {time.monotonic() - start:.1f} s")
        for report in first:
            assert _ops(report) == {
                "efa.installer": False, "python.venv": True, "python.wheelhouse": True, "python.packages": True,
                "pdctl.ship": True, "vllm.compat": False, "model.download": False,
            }, report.node
        for node in ("h1", "h2"):
            venv = tmp_path / node / "venv"
            probe = "import pdctl, pdctl_probe; print(pdctl.__version__, pdctl_probe.VALUE, pdctl.__file__)"
            out = hosts[node].check([f"{venv}/bin/python", "-c", probe]).stdout.split()
            assert out[:2] == [pdctl.__version__, "42"], node
            assert out[2].startswith(str(venv)), "the node's own venv holds the shipped pdctl"
            assert (tmp_path / node / "work/wheelhouse/pdctl_probe-1.0-py3-none-any.whl").is_file()
            assert (tmp_path / node / f"work/wheels/{wheel.path.name}").is_file()
        assert not (tmp_path / "shared-venv").exists() and not (tmp_path / "shared-work").exists()

        console = _console()
        second = provision(topo, plan(topo), hosts, console, layouts=layouts, wheel=wheel)
    text = console.export_text()
    for report in second:
        assert not report.changed, report
        assert f"{report.node}: no changes" in text
        print(f"second provisioning over SSH, {report.node}: {report.seconds:.2f} s")

    try:
        deployment = up(topo, _console(), UpOptions(ssh=ssh, provision=False, timeout=60))
        assert deployment.smoke is not None and deployment.smoke.turn2.outcome == "hit"
        state = StateStore(topo.name).load()
        assert state is not None
        for name, node in (("prefill-0", "h1"), ("decode-0", "h2"), ("router", "h1")):
            assert _cmdline(state.processes[name].pid)[0] == str(tmp_path / node / "venv/bin/python"), name
        assert (tmp_path / f"h2/work/{topo.name}/logs/decode-0.log").is_file()
        _upgrade_rolls_the_engines(topo, ssh, wheelhouse, tmp_path, monkeypatch)
    finally:
        down(topo, _console(), ssh=ssh, timeout=5)
    assert LocalTransport().find_by_marker(topo.name) == []


def _upgrade_rolls_the_engines(topo: Topology, ssh: SshOptions, wheelhouse: Path, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade of what the engines run (a new version of a package in python.packages: the stand-in for
    python.vllm_version) by `up --restart --rolling`: each node's venv is upgraded before any engine is replaced,
    the engines are replaced one at a time, and the one router is kept (with no second router its restart would
    end its requests)."""
    make_wheel(wheelhouse, "pdctl-probe", "2.0", {"pdctl_probe/__init__.py": b"VALUE = 43\n"})
    newer = topo.model_copy(update={"python": topo.python.model_copy(update={"packages": ["pdctl-probe==2.0"]})})
    layout = tmp_path / "layout.json"  # up's own provisioning finds this interpreter's packages, as above
    layout.write_text(json.dumps({"*": {"path": list(PYTHON_LAYOUT.path), "env": dict(topo.env.all)}}))
    monkeypatch.setenv("PDCTL_HOST_LAYOUT", str(layout))
    state = StateStore(topo.name).load()
    assert state is not None
    before = {n: r.pid for n, r in state.processes.items()}
    up(newer, _console(), UpOptions(ssh=ssh, restart=True, rolling=True, timeout=60))
    after = StateStore(topo.name).load()
    assert after is not None
    assert after.processes["router"].pid == before["router"]
    for name, node in (("prefill-0", "h1"), ("decode-0", "h2")):
        pid = after.processes[name].pid
        assert pid != before[name], name
        venv = tmp_path / node / "venv"
        probe = "import pdctl_probe; print(pdctl_probe.VALUE, pdctl_probe.__file__)"
        value, where = subprocess.run([f"{venv}/bin/python", "-c", probe], capture_output=True, text=True,
                                      check=True).stdout.split()
        assert value == "43", node
        # installed before the new engine started: the replacement runs the upgrade
        assert Path(where).stat().st_mtime <= Path(f"/proc/{pid}").stat().st_ctime, name


def _golden(fact: str, case: str) -> Any:
    return json.loads((GOLDEN / fact / f"{case}.json").read_text())["expected"]


def test_vllm_host_facts_over_ssh_equal_the_local_ones(lab: SshLab, ssh: SshOptions, tmp_path: Path) -> None:
    root, layout = host_root(tmp_path, "h1")
    installer_env = {"FAKE_HOST_ROOT": str(root), "PATH": "/usr/bin:/bin"}
    subprocess.run([str(FAKEBIN / "efa_installer.sh"), "-y"], env=installer_env, check=True, capture_output=True)
    topo = topology(
        nodes=[{"name": "h1", "address": lab.hosts[0].address, "ssh_alias": "h1", "transport": "ssh", "gpus": 8}],
        prefill=[{"node": "h1", "gpus": [0], "port": 18100}],
        decode=[{"node": "h1", "gpus": [1], "port": 18200}],
        router={"node": "h1", "port": 18000},
        efa={"required": True, "installer_version": "1.47.0"},
        python={"venv": str(tmp_path / "venv"), "vllm_version": "0.26.0"},
        work_dir=str(tmp_path / "work"),
    )
    [ctx] = contexts(topo, plan(topo), {"h1": layout})
    facts = [f for f in doctor.facts_for(ctx) if not isinstance(f, ListeningPorts)]  # per network namespace
    local = gather(LocalTransport("h1"), facts, layout)
    with connected(topo.nodes, ssh) as hosts:
        remote = gather(hosts["h1"], facts, layout)
    by_name = {f.name: f.to_json(remote[f.key()]) for f in facts}
    local_by_name = {f.name: f.to_json(local[f.key()]) for f in facts}
    # free disk is read twice, a moment apart, on a disk other processes write to: equal to within 1 GiB
    assert abs(int(by_name.pop("host.DiskFree")) - int(local_by_name.pop("host.DiskFree"))) < 2**30
    assert by_name == local_by_name
    assert by_name["gpu.NvidiaSmi"] == _golden("gpu.NvidiaSmi", "p5en-8x-h200")
    assert by_name["efa.FiInfo"] == _golden("efa.FiInfo", "p5en-16-devices")
    assert by_name["efa.EfaModule"] == _golden("efa.EfaModule", "current")
    assert by_name["efa.InstallerVersion"] == _golden("efa.InstallerVersion", "installed-1.47.0")
    assert by_name["host.Sudo"] == _golden("host.Sudo", "root")


def test_ctrl_c_during_provisioning_is_said_at_once_and_stops_after_the_running_step(
    lab: SshLab, tmp_path: Path
) -> None:
    """`pdctl up` over SSH, a real SIGINT while the hosts are being provisioned: the interruption is said at once
    with the step each host is finishing, each host stops after that step, nothing is started, exit 130."""
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "pdctl-probe", "1.0", {"pdctl_probe/__init__.py": b"VALUE = 42\n"})
    topo = _sim_topology(lab, tmp_path, wheelhouse)
    path = tmp_path / "topology.yaml"
    path.write_text(json.dumps(topo.model_dump(mode="json", exclude_unset=True)))  # JSON is YAML
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"*": {"path": list(PYTHON_LAYOUT.path), "env": dict(topo.env.all)}}))
    env = {**os.environ, "PDCTL_HOME": str(tmp_path / "home"), "PDCTL_HOST_LAYOUT": str(layout), "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdctl", "up", "-t", str(path), "--ssh-config", str(lab.ssh_config()),
         "--known-hosts", str(lab.known_hosts())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )
    killer = threading.Timer(300, proc.kill)  # the output is read to its end below: a hung `up` must end too
    killer.start()
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if " python.venv: " in line:  # a host began changing
                break
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()  # through the same buffer as the lines above (communicate() would skip it)
        proc.wait()
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
        down(topo, _console(), ssh=SshOptions(ssh_config=lab.ssh_config(), known_hosts=lab.known_hosts()), timeout=5)
    lines += rest.splitlines()
    text = "\n".join(lines)
    assert proc.returncode == 130, text
    [said] = [i for i, x in enumerate(lines) if x.startswith("interrupt received: finishing ")]
    assert " python.venv: " in lines[said], lines[said]  # names the step it finishes
    assert lines[said].endswith("then provisioning stops: nothing more is installed and nothing is started")
    for node in ("h1", "h2"):
        # said before the host's stop line; after it, at most the step that was already under way
        [stop] = [i for i, x in enumerate(lines) if x.startswith(f"{node}: stopped (Ctrl-C) after ")]
        assert said < stop, text
        assert len([x for x in lines[said:] if x.startswith(f"  {node} ")]) <= 1, text
    assert f"interrupted: provisioning stopped, {topo.name} was not started" in text
    assert not any(x.startswith("started ") for x in lines), text
    assert "Traceback" not in text
    assert LocalTransport().find_by_marker(topo.name) == []
