"""SSH test hosts: Linux network namespaces on a private bridge, each running a real OpenSSH server.

`SshLab.create(tmp, count)` makes namespaces `pd<pid><lab letter><host letter>` with veth ends on a bridge
in the root namespace (10.123.<x>.0/24, x chosen unused), `lo` up, and `/usr/sbin/sshd -D` inside each
on a host key made here; one client key is authorized for root.
The hosts share this machine's PID space and filesystem, which is why pdctl tags every process with its
node. `close()` removes everything, also after a failed test; what a killed session left behind is
removed by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

SSHD = "/usr/sbin/sshd"
PREFIX = "pd"
LOCK = Path("/tmp/pdctl-netns.lock")
_labs = iter("abcdefghijklmnopqrstuvwxyz")
LabT = TypeVar("LabT", bound="SshLab")


def unavailable() -> str | None:
    """Why SSH test hosts cannot be created here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    for tool in ("ip", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/test installs iproute2 and openssh)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (scripts/test installs openssh-server)"
    probe = f"{PREFIX}{os.getpid()}probe"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return f"cannot create network namespaces here: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


@dataclass
class LabHost:
    node: str
    netns: str
    address: str
    host_key: Path
    sshd: subprocess.Popen[bytes] | None = None

    @property
    def host_key_line(self) -> str:
        kind, b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{self.address} {kind} {b64}"


@dataclass
class SshLab:
    tmp: Path
    subnet: str
    bridge: str
    client_key: Path
    hosts: list[LabHost] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # bridges and our ends of the veth pairs, in creation order

    @classmethod
    def create(cls, tmp: Path, count: int = 3) -> SshLab:
        client_key = prepare_keys(tmp)
        tag = f"{PREFIX}{os.getpid()}{next(_labs)}"
        with locked():
            subnet = _free_subnet()
            lab = cls(tmp=tmp, subnet=subnet, bridge=f"{tag}br", client_key=client_key)
            with lab.closed_on_failure():
                lab.add_bridge(lab.bridge, f"{subnet}.1/24")
        with lab.closed_on_failure():
            for i in range(count):
                lab.hosts.append(lab.add_host(f"h{i + 1}", f"{tag}{chr(ord('a') + i)}", f"{subnet}.{10 + i}"))
            for host in lab.hosts:
                _wait_port(host.address, 22, host)
        return lab

    @contextmanager
    def closed_on_failure(self) -> Iterator[None]:
        """Whatever a failed step of building the lab left is removed at once."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def add_bridge(self, name: str, address: str | None = None) -> None:
        self.links.append(name)
        _ip("link", "add", name, "type", "bridge")
        if address is not None:
            _ip("addr", "add", address, "dev", name)
        _ip("link", "set", name, "up")

    def add_netns(self, netns: str, bridge: str, address: str, veth: str) -> None:
        """A namespace whose `eth0` (`address`/24) is the peer of `veth` on `bridge`; `lo` up."""
        self.namespaces.append(netns)
        _ip("netns", "add", netns)
        self.attach(netns, bridge, address, veth, "eth0")
        _ip("-n", netns, "link", "set", "lo", "up")

    def attach(self, netns: str, bridge: str, address: str, veth: str, dev: str) -> None:
        """An interface `dev` (`address`/24) in `netns`: the peer of `veth`, which hangs on `bridge`."""
        self.links.append(veth)
        _ip("link", "add", veth, "type", "veth", "peer", "name", dev, "netns", netns)
        _ip("link", "set", veth, "master", bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", dev)
        _ip("-n", netns, "link", "set", dev, "up")

    def add_host(self, node: str, netns: str, address: str) -> LabHost:
        """A host on the lab's bridge: its namespace and its sshd."""
        self.add_netns(netns, self.bridge, address, f"{netns}v")
        return self.start_host(node, netns, address)

    def start_host(self, node: str, netns: str, address: str) -> LabHost:
        """A host key made here, and sshd with it on `address` in `netns` (an existing namespace)."""
        host = LabHost(node=node, netns=netns, address=address, host_key=self.tmp / f"host_{node}")
        _keygen(host.host_key)
        self.start_sshd(host)
        return host

    def start_sshd(self, host: LabHost) -> None:
        cfg = self.tmp / f"sshd_{host.node}.conf"
        cfg.write_text(
            "\n".join(
                [
                    f"ListenAddress {host.address}",
                    "Port 22",
                    f"HostKey {host.host_key}",
                    f"PidFile {self.tmp}/sshd_{host.node}.pid",
                    f"AuthorizedKeysFile {self.tmp}/authorized_keys",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxSessions 100",
                    "MaxStartups 100",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        log = (self.tmp / f"sshd_{host.node}.log").open("ab")
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", str(cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def stop_sshd(self, host: LabHost) -> None:
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.terminate()
            host.sshd.wait(10)
        host.sshd = None

    def known_hosts(self, hosts: list[LabHost] | None = None) -> Path:
        """A known_hosts file trusting `hosts` (default: every server of the lab)."""
        path = self.tmp / f"known_hosts_{time.monotonic_ns()}"
        path.write_text("".join(h.host_key_line + "\n" for h in (self.servers() if hosts is None else hosts)))
        return path

    def ssh_config(self, extra: str = "") -> Path:
        """An ssh config giving every host an alias `<node>` with the client key."""
        path = self.tmp / f"ssh_config_{time.monotonic_ns()}"
        blocks = [
            f"Host {h.node}\n  HostName {h.address}\n  User root\n  IdentityFile {self.client_key}\n"
            for h in self.hosts
        ]
        path.write_text("\n".join(blocks) + extra)
        return path

    def servers(self) -> list[LabHost]:
        """Every host running an sshd of this lab."""
        return self.hosts

    def close(self) -> None:
        for host in self.servers():
            self.stop_sshd(host)
        for netns in self.namespaces:
            _kill_netns_pids(netns)
        # Deleting our end removes the pair now; the namespace itself may linger while TIME_WAIT sockets do.
        for link in reversed(self.links):  # the veths, then the bridges they hang on
            _ip("link", "del", link, check=False)
        for netns in self.namespaces:
            _ip("netns", "del", netns, check=False)


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pdctl-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _free_subnet() -> str:
    used = _ip("-4", "addr").stdout + _ip("-4", "route").stdout
    start = os.getpid() % 200
    for i in range(250):
        x = (start + i) % 250 + 1
        net = ipaddress.ip_network(f"10.123.{x}.0/24")
        if f"10.123.{x}." not in used and not any(
            ipaddress.ip_address(a) in net for a in re.findall(r"\d+\.\d+\.\d+\.\d+", used)
        ):
            return f"10.123.{x}"
    raise RuntimeError("no free 10.123.x.0/24 subnet for the SSH test hosts")


def _wait_port(address: str, port: int, host: LabHost, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.sshd is not None and host.sshd.poll() is not None:
            raise RuntimeError(f"sshd for {host.node} exited with {host.sshd.returncode}")
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd on {address}:{port} did not come up in {timeout:g}s")


def _kill_netns_pids(netns: str) -> None:
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


def _remove_stale() -> None:
    """Namespaces and bridges of test sessions whose process is gone (killed runs leave them behind)."""
    listing = _ip("netns", "list", check=False).stdout
    links = _ip("-o", "link", check=False).stdout
    names = set(re.findall(rf"^({PREFIX}\d+[a-z]+)\b", listing, re.M))
    names |= set(re.findall(rf"^\d+: ({PREFIX}\d+[a-z](?:br|[a-z]v))[:@]", links, re.M))
    for name in names:
        pid = int(re.match(rf"{PREFIX}(\d+)", name).group(1))  # type: ignore[union-attr]
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        if name.endswith(("br", "v")):
            _ip("link", "del", name, check=False)
        else:
            _kill_netns_pids(name)
            _ip("netns", "del", name, check=False)


def prepare_keys(tmp: Path) -> Path:
    """A new lab's directory and client key (authorized for root on every host); stale labs are removed first."""
    tmp.mkdir(parents=True, exist_ok=True)
    _remove_stale()
    client_key = tmp / "client_key"
    _keygen(client_key)
    (tmp / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    return client_key


@contextmanager
def locked() -> Iterator[None]:
    """One session at a time picks addresses and makes bridges: two must never take the same subnet."""
    LOCK.touch()
    with LOCK.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def skip_or_fail(required: str, skipped: str) -> NoReturn:
    """A lab that cannot exist here: the test is skipped, except under CI, where it must run and so fails."""
    if os.environ.get("CI"):
        pytest.fail(required)
    pytest.skip(skipped)


@contextmanager
def fixture_lab(create: Callable[[], LabT]) -> Iterator[LabT]:
    """The lab `create` makes, for a fixture (closed after it); skipped or failed where namespaces cannot exist."""
    reason = unavailable()
    if reason:
        skip_or_fail(f"SSH test hosts are required in CI but cannot be created: {reason}", f"SSH test hosts: {reason}")
    lab = create()
    try:
        yield lab
    finally:
        lab.close()


@contextmanager
def running_lab(directory: Path, count: int) -> Iterator[SshLab]:
    """A lab of `count` hosts for a fixture."""
    with fixture_lab(lambda: SshLab.create(directory, count=count)) as lab:
        yield lab
