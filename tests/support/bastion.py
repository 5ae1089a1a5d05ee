"""A private cluster in network namespaces: nodes on a subnet that only a bastion reaches, and a CLI namespace
that reaches only the bastion.

    cli ns (public .2) --- public bridge --- bastion (public .5 | private .5) --- private bridge --- h1 h2 h3 (.10..)

Neither bridge has an address in the root namespace, so nothing here routes to the nodes but the bastion (whose
namespace does not forward). pdctl runs in the CLI namespace (`ip netns exec`); its SSH config reaches the nodes
with `Include` + `ProxyJump bastion`, or a `ProxyCommand ssh -W %h:%p bastion`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.netns import (
    LOCK,
    PREFIX,
    LabHost,
    SshLab,
    _ip,
    _keygen,
    _kill_netns_pids,
    _labs,
    _remove_stale,
    unavailable,
)


@dataclass
class PrivateLab(SshLab):
    public_bridge: str = ""
    public_subnet: str = ""
    bastion: LabHost | None = None
    cli_netns: str = ""
    extra_links: list[str] = field(default_factory=list)

    @classmethod
    def create_private(cls, tmp: Path, count: int = 3) -> PrivateLab:
        import fcntl

        tmp.mkdir(parents=True, exist_ok=True)
        _remove_stale()
        client_key = tmp / "client_key"
        _keygen(client_key)
        (tmp / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        tag, ptag = (f"{PREFIX}{os.getpid()}{next(_labs)}" for _ in range(2))
        x = os.getpid() % 250 + 1
        private, public = f"10.124.{x}", f"10.125.{x}"
        LOCK.touch()
        with LOCK.open() as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            lab = cls(tmp=tmp, subnet=private, bridge=f"{tag}br", client_key=client_key,
                      public_bridge=f"{ptag}br", public_subnet=public, cli_netns=f"{ptag}y")
            try:
                for bridge in (lab.bridge, lab.public_bridge):
                    _ip("link", "add", bridge, "type", "bridge")
                    _ip("link", "set", bridge, "up")
            except BaseException:
                lab.close()
                raise
        try:
            bastion = f"{tag}z"
            lab._netns(bastion, lab.public_bridge, f"{public}.5", f"{ptag}zv")
            _ip("link", "add", f"{tag}zv", "type", "veth", "peer", "name", "eth1", "netns", bastion)
            _ip("link", "set", f"{tag}zv", "master", lab.bridge, "up")
            _ip("-n", bastion, "addr", "add", f"{private}.5/24", "dev", "eth1")
            _ip("-n", bastion, "link", "set", "eth1", "up")
            lab.extra_links.append(f"{tag}zv")
            lab.bastion = LabHost(node="bastion", netns=bastion, address=f"{public}.5", host_key=tmp / "host_bastion")
            _keygen(lab.bastion.host_key)
            lab.start_sshd(lab.bastion)
            lab._netns(lab.cli_netns, lab.public_bridge, f"{public}.2", f"{ptag}yv")
            for i in range(count):
                node, netns, address = f"h{i + 1}", f"{tag}{chr(ord('a') + i)}", f"{private}.{10 + i}"
                lab._netns(netns, lab.bridge, address, f"{netns}v")
                host = LabHost(node=node, netns=netns, address=address, host_key=tmp / f"host_{node}")
                _keygen(host.host_key)
                lab.start_sshd(host)
                lab.hosts.append(host)
            for host in [lab.bastion, *lab.hosts]:
                _wait_listening(host)
        except BaseException:
            lab.close()
            raise
        return lab

    def _netns(self, netns: str, bridge: str, address: str, veth: str) -> None:
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", veth, "master", bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        self.extra_links.append(veth)

    def known_hosts(self, hosts: list[LabHost] | None = None) -> Path:
        assert self.bastion is not None
        return super().known_hosts([self.bastion, *self.hosts] if hosts is None else hosts)

    def private_config(self, hop: str = "jump") -> Path:
        """`~/.ssh/config`-style file: the bastion, and `Include` of the node entries behind it."""
        assert self.bastion is not None
        kh = self.known_hosts()
        stamp = time.monotonic_ns()
        main, nodes = self.tmp / f"ssh_config_{stamp}", self.tmp / f"ssh_nodes_{stamp}.conf"
        common = (f"  User root\n  IdentityFile {self.client_key}\n  UserKnownHostsFile {kh}\n"
                  "  StrictHostKeyChecking yes\n  BatchMode yes\n")
        via = "  ProxyJump bastion\n" if hop == "jump" else f"  ProxyCommand ssh -F {main} -W %h:%p bastion\n"
        nodes.write_text("".join(f"Host {h.node}\n  HostName {h.address}\n{common}{via}" for h in self.hosts))
        main.write_text(f"Include {nodes}\n\nHost bastion\n  HostName {self.bastion.address}\n{common}")
        return main

    def in_cli(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 180) -> \
            subprocess.CompletedProcess[str]:
        """Run a command in the CLI namespace, the one place with no route to the nodes."""
        return subprocess.run(["ip", "netns", "exec", self.cli_netns, *argv], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **(env or {})}, check=False)

    def pdctl(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.in_cli(sys.executable, "-m", "pdctl", *args, env=env)

    def close(self) -> None:
        for host in [*self.hosts, *([self.bastion] if self.bastion else [])]:
            self.stop_sshd(host)
        for netns in [h.netns for h in self.hosts] + ([self.bastion.netns] if self.bastion else []) + \
                [self.cli_netns]:
            _kill_netns_pids(netns)
            _ip("netns", "del", netns, check=False)
        for link in [*self.extra_links, self.bridge, self.public_bridge]:
            _ip("link", "del", link, check=False)


def _wait_listening(host: LabHost, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.sshd is not None and host.sshd.poll() is not None:
            raise RuntimeError(f"sshd for {host.node} exited with {host.sshd.returncode}")
        res = subprocess.run(["ip", "netns", "exec", host.netns, "ss", "-Hltn", "sport = :22"],
                             capture_output=True, text=True, check=False)
        if res.stdout.strip():
            return
        time.sleep(0.1)
    raise RuntimeError(f"sshd on {host.node} ({host.address}) did not listen in {timeout:g}s")


@contextmanager
def private_lab(directory: Path, count: int = 3) -> Iterator[PrivateLab]:
    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"SSH test hosts are required in CI but cannot be created: {reason}")
        pytest.skip(f"SSH test hosts: {reason}")
    lab = PrivateLab.create_private(directory, count=count)
    try:
        yield lab
    finally:
        lab.close()
