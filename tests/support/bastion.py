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
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns import PREFIX, LabHost, SshLab, _labs, fixture_lab, locked, prepare_keys


@dataclass
class PrivateLab(SshLab):
    public_bridge: str = ""
    public_subnet: str = ""
    bastion: LabHost | None = None
    cli_netns: str = ""

    @classmethod
    def create_private(cls, tmp: Path, count: int = 3) -> PrivateLab:
        client_key = prepare_keys(tmp)
        tag, ptag = (f"{PREFIX}{os.getpid()}{next(_labs)}" for _ in range(2))
        x = os.getpid() % 250 + 1
        private, public = f"10.124.{x}", f"10.125.{x}"
        with locked():
            lab = cls(tmp=tmp, subnet=private, bridge=f"{tag}br", client_key=client_key,
                      public_bridge=f"{ptag}br", public_subnet=public, cli_netns=f"{ptag}y")
            with lab.closed_on_failure():
                for bridge in (lab.bridge, lab.public_bridge):
                    lab.add_bridge(bridge)
        with lab.closed_on_failure():
            bastion = f"{tag}z"
            lab.add_netns(bastion, lab.public_bridge, f"{public}.5", f"{ptag}zv")
            lab.attach(bastion, lab.bridge, f"{private}.5", f"{tag}zv", "eth1")
            lab.bastion = lab.start_host("bastion", bastion, f"{public}.5")
            lab.add_netns(lab.cli_netns, lab.public_bridge, f"{public}.2", f"{ptag}yv")
            for i in range(count):
                lab.hosts.append(lab.add_host(f"h{i + 1}", f"{tag}{chr(ord('a') + i)}", f"{private}.{10 + i}"))
            for host in lab.servers():
                _wait_listening(host)
        return lab

    def servers(self) -> list[LabHost]:
        return [*([self.bastion] if self.bastion else []), *self.hosts]

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
    with fixture_lab(lambda: PrivateLab.create_private(directory, count=count)) as lab:
        yield lab
