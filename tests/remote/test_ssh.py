"""SshTransport against real OpenSSH servers in network namespaces (tests/support/netns.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from pdctl.errors import ConnectError
from pdctl.lifecycle.hosts.connect import connected
from pdctl.lifecycle.hosts.launch import running, stop
from pdctl.remote.procs import DetachedJob
from pdctl.remote.ssh import connect_ssh
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Node
from tests.conftest import free_port
from tests.support.netns import SshLab

pytestmark = pytest.mark.ssh


def _opts(lab: SshLab, **kw: object) -> SshOptions:
    base: dict[str, object] = {"ssh_config": lab.ssh_config(), "known_hosts": lab.known_hosts()}
    base.update(kw)
    return SshOptions(**base)  # type: ignore[arg-type]


def _node(lab: SshLab, i: int = 0, **kw: object) -> Node:
    h = lab.hosts[i]
    return Node(name=h.node, address=h.address, ssh_alias=h.node, **kw)  # type: ignore[arg-type]


def test_run_put_and_read_over_ssh(lab: SshLab, tmp_path: Path) -> None:
    t = connect_ssh(_node(lab), _opts(lab))
    try:
        res = t.run("echo out; echo err >&2; ip -4 -o addr show eth0; exit 5", env={"A": "b c"})
        assert res.exit_code == 5 and res.stderr == "err\n"
        assert lab.hosts[0].address in res.stdout
        assert t.run(["cat"], stdin=b"payload").stdout == "payload"
        src = tmp_path / "f.bin"
        src.write_bytes(b"z" * 100_000)
        seen: list[tuple[int, int]] = []
        dest = f"{tmp_path}/up/dir/f.bin"
        t.put(src, dest, progress=lambda d, n: seen.append((d, n)))
        assert Path(dest).read_bytes() == src.read_bytes() and seen[-1] == (100_000, 100_000)
        assert t.read_text(dest + ".missing") is None
    finally:
        t.close()


def test_unknown_host_key_is_refused_then_accepted_and_recorded(lab: SshLab, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    with pytest.raises(ConnectError) as info:
        connect_ssh(_node(lab, 1), _opts(lab, known_hosts=kh))
    assert f"host key of {lab.hosts[1].address} is not in {kh}" in str(info.value)
    assert "--accept-new-host-keys" in info.value.hint
    assert not kh.exists()
    connect_ssh(_node(lab, 1), _opts(lab, known_hosts=kh, accept_new_host_keys=True)).close()
    assert kh.read_text().split()[:2] == lab.hosts[1].host_key_line.split()[:2]
    connect_ssh(_node(lab, 1), _opts(lab, known_hosts=kh)).close()


def test_changed_host_key_is_a_hard_error_with_the_fix(lab: SshLab, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    other = lab.hosts[2].host_key_line.split()
    kh.write_text(f"{lab.hosts[0].address} {other[1]} {other[2]}\n")
    with pytest.raises(ConnectError) as info:
        connect_ssh(_node(lab), _opts(lab, known_hosts=kh, accept_new_host_keys=True))
    assert "HOST KEY CHANGED" in str(info.value)
    assert info.value.hint == f"if the change is expected: ssh-keygen -R {lab.hosts[0].address} -f {kh}"


def test_wrong_key_is_an_authentication_error(lab: SshLab, tmp_path: Path) -> None:
    import subprocess

    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    h = lab.hosts[0]
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host stranger\n  HostName {h.address}\n  User root\n  IdentityFile {key}\n")
    with pytest.raises(ConnectError) as info:
        connect_ssh(Node(name="h1", address=h.address, ssh_alias="stranger"),
                    SshOptions(ssh_config=cfg, known_hosts=lab.known_hosts(), identity_files=()))
    assert str(info.value).startswith(f"h1: authentication failed for root@{h.address}:22 (keys tried: {key})")


def test_host_that_is_down_is_a_clear_error(lab: SshLab) -> None:
    node = Node(name="dead", address=lab.hosts[0].address, port=free_port(), user="root")
    with pytest.raises(ConnectError) as info:
        connect_ssh(node, _opts(lab))
    assert str(info.value) == f"dead: unreachable: root@{lab.hosts[0].address}:{node.port}: connection refused"


def test_proxyjump_reaches_a_host_through_a_bastion(lab: SshLab) -> None:
    target = lab.hosts[1]
    cfg = lab.ssh_config(
        f"\nHost inner\n  HostName {target.address}\n  User root\n  IdentityFile {lab.client_key}\n  ProxyJump h1\n"
    )
    t = connect_ssh(Node(name="inner", address="unused.invalid", ssh_alias="inner"), _opts(lab, ssh_config=cfg))
    try:
        # sshd on the target sees the connection coming from the bastion, not from this machine.
        assert t.run("echo $SSH_CLIENT").stdout.split()[0] == lab.hosts[0].address
    finally:
        t.close()


def test_connected_opens_all_hosts_in_parallel_and_reports_every_failure(lab: SshLab) -> None:
    nodes = [_node(lab, 0), _node(lab, 1)]
    with connected(nodes, _opts(lab)) as hosts:
        assert {n: t.run("hostname -I").stdout.split()[0] for n, t in hosts.items()} == {
            "h1": lab.hosts[0].address, "h2": lab.hosts[1].address,
        }
    bad = [*nodes, Node(name="dead", address=lab.hosts[2].address, port=free_port(), user="root")]
    with pytest.raises(ConnectError, match="dead: unreachable"), connected(bad, _opts(lab)):
        pass


def test_detached_start_survives_the_session_and_stops_by_node(lab: SshLab, tmp_path: Path) -> None:
    dep = f"t-{uuid.uuid4().hex[:8]}"
    opts = _opts(lab)
    with connected([_node(lab, 0), _node(lab, 1)], opts) as hosts:
        for node, t in hosts.items():
            t.start_detached(DetachedJob(
                unit=f"pdctl-{dep}-p", argv=("sleep", "300"),
                env={"PDCTL_DEPLOYMENT": dep, "PDCTL_NODE": node, "PDCTL_PROCESS": "p"},
                workdir=str(tmp_path), log_path=f"{tmp_path}/logs/{node}.log",
            ))
    with connected([_node(lab, 0), _node(lab, 1)], opts) as hosts:
        try:
            assert list(running(hosts["h1"], dep, "h1")) == ["p"]
            assert stop(hosts["h1"], dep, "h1")
            assert running(hosts["h1"], dep, "h1") == {}
            assert list(running(hosts["h2"], dep, "h2")) == ["p"]
        finally:
            stop(hosts["h1"], dep, "h1")
            stop(hosts["h2"], dep, "h2")
        assert hosts["h2"].find_by_marker(dep) == []


def test_a_connection_that_drops_while_a_command_runs_fails_naming_the_host(lab: SshLab) -> None:
    import threading

    from tests.support.netns import _kill_netns_pids

    host = lab.hosts[2]
    t = connect_ssh(_node(lab, 2), _opts(lab))
    killer = threading.Timer(1.0, _kill_netns_pids, args=(host.netns,))  # sshd and its sessions die, no goodbye
    killer.start()
    try:
        with pytest.raises(ConnectError) as info:
            t.run("sleep 30", timeout=None)
        assert str(info.value) == f"h3: the SSH connection (root@{host.address}) dropped while a command ran"
    finally:
        killer.join()
        t.close()
        lab.stop_sshd(host)
        lab.start_sshd(host)
        from tests.support.netns import _wait_port

        _wait_port(host.address, 22, host)
