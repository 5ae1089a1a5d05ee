"""known_hosts markers and servers that want a second factor, against real OpenSSH servers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pdctl.errors import ConnectError
from pdctl.remote.ssh import connect_ssh
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Node
from tests.conftest import free_port
from tests.support.netns import SSHD, SshLab

pytestmark = pytest.mark.ssh


def _node(lab: SshLab, i: int = 0, **kw: object) -> Node:
    h = lab.hosts[i]
    return Node(name=h.node, address=h.address, ssh_alias=h.node, **kw)  # type: ignore[arg-type]


def _key(lab: SshLab, i: int) -> str:
    return " ".join(lab.hosts[i].host_key_line.split()[1:])


def test_marker_lines_do_not_break_plain_entries(lab: SshLab, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority *.corp.example {_key(lab, 1)}\n@revoked 192.0.2.99 {_key(lab, 2)}\n"
                  f"garbage line\n{lab.hosts[0].host_key_line}\n")
    t = connect_ssh(_node(lab), SshOptions(ssh_config=lab.ssh_config(), known_hosts=kh))
    try:
        assert t.run("echo ok").stdout == "ok\n"
    finally:
        t.close()


def test_a_revoked_host_key_is_refused_even_when_also_listed(lab: SshLab, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{lab.hosts[0].host_key_line}\n@revoked {lab.hosts[0].address} {_key(lab, 0)}\n")
    with pytest.raises(ConnectError) as info:
        connect_ssh(_node(lab), SshOptions(ssh_config=lab.ssh_config(), known_hosts=kh, accept_new_host_keys=True))
    assert str(info.value).startswith(f"h1: the host key of {lab.hosts[0].address} is marked @revoked in {kh} (")
    assert info.value.hint == "replace the host's key, or remove the @revoked line"


def test_a_host_trusted_only_through_a_cert_authority_is_refused_clearly(lab: SshLab, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# ours\n@cert-authority {lab.subnet}.* {_key(lab, 1)}\n")
    with pytest.raises(ConnectError) as info:
        connect_ssh(_node(lab), SshOptions(ssh_config=lab.ssh_config(), known_hosts=kh))
    assert str(info.value) == (f"h1: {lab.hosts[0].address} is trusted through a @cert-authority ({kh}:2); "
                               "pdctl cannot verify SSH host certificates")


def test_a_second_factor_fails_as_authentication_and_never_prompts(lab: SshLab, tmp_path: Path) -> None:
    host, port = lab.hosts[1], free_port()
    cfg = tmp_path / "sshd_2fa.conf"
    cfg.write_text("\n".join([
        f"ListenAddress {host.address}", f"Port {port}", f"HostKey {host.host_key}", f"PidFile {tmp_path}/2fa.pid",
        f"AuthorizedKeysFile {lab.tmp}/authorized_keys", "PermitRootLogin yes", "StrictModes no",
        "UsePAM yes", "KbdInteractiveAuthentication yes", "PasswordAuthentication yes",
        "AuthenticationMethods publickey,keyboard-interactive", "",
    ]))
    sshd = subprocess.Popen(["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not subprocess.run(["ip", "netns", "exec", host.netns, "ss", "-Hltn", f"sport = :{port}"],
                                 capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline and sshd.poll() is None, "the 2FA sshd did not start"
            time.sleep(0.1)
        kh = tmp_path / "known_hosts"
        kh.write_text(f"[{host.address}]:{port} {_key(lab, 1)}\n")
        with pytest.raises(ConnectError) as info:
            connect_ssh(_node(lab, 1, port=port, user="root"),
                        SshOptions(ssh_config=lab.ssh_config(), known_hosts=kh))
        assert str(info.value) == (
            f"h2: authentication failed for root@{host.address}:{port} (keys tried: {lab.client_key}): the server "
            "asks for keyboard-interactive or password authentication after the key (a second factor?); "
            "pdctl never prompts")
    finally:
        sshd.terminate()
        sshd.wait(10)
