"""Facts about the host itself: OS, architecture, privileges, limits, disk, listening ports, boot id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from pdctl.facts.base import Fact, HostLayout, path


@dataclass(frozen=True)
class OsInfo:
    id: str
    version: str
    pretty: str


class OsRelease(Fact[OsInfo | None]):
    """`/etc/os-release`: distribution id and version (ubuntu 24.04, amzn 2023)."""

    name = "host.OsRelease"
    result = OsInfo | None

    def command(self, layout: HostLayout) -> str:
        return "cat /etc/os-release"

    def process(self, lines: list[str]) -> OsInfo | None:
        fields: dict[str, str] = {}
        for line in lines:
            key, sep, value = line.partition("=")
            if sep:
                fields[key.strip()] = value.strip().strip('"')
        if "ID" not in fields:
            return None
        return OsInfo(fields["ID"], fields.get("VERSION_ID", ""), fields.get("PRETTY_NAME", fields["ID"]))

    def default(self) -> OsInfo | None:
        return None


class Arch(Fact[str]):
    """`uname -m`: x86_64 or aarch64."""

    name = "host.Arch"
    result = str

    def command(self, layout: HostLayout) -> str:
        return "uname -m"

    def process(self, lines: list[str]) -> str:
        return lines[0].strip() if lines else ""

    def default(self) -> str:
        return ""


@dataclass(frozen=True)
class Privilege:
    root: bool
    sudo: bool


class Sudo(Fact[Privilege]):
    """Whether commands run as root, or can become root without a password (`sudo -n`)."""

    name = "host.Sudo"
    result = Privilege

    def command(self, layout: HostLayout) -> str:
        return (
            'echo "uid=$(id -u)"; '
            "if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then echo sudo=yes; "
            "else echo sudo=no; fi"
        )

    def process(self, lines: list[str]) -> Privilege:
        kv = dict(line.split("=", 1) for line in lines if "=" in line)
        return Privilege(root=kv.get("uid") == "0", sudo=kv.get("sudo") == "yes")

    def default(self) -> Privilege:
        return Privilege(root=False, sudo=False)


class Memlock(Fact[int | None]):
    """`ulimit -l` of a fresh shell in KiB; None means unlimited (what EFA needs)."""

    name = "host.Memlock"
    result = int | None

    def command(self, layout: HostLayout) -> str:
        return "ulimit -l"

    def process(self, lines: list[str]) -> int | None:
        value = lines[0].strip() if lines else "0"
        return None if value == "unlimited" else int(value) if value.isdigit() else 0

    def default(self) -> int | None:
        return 0


@dataclass(frozen=True)
class DiskFree(Fact[int | None]):
    """Bytes free on the filesystem that holds `where` (its nearest existing parent); None if unknown."""

    where: str
    name: ClassVar[str] = "host.DiskFree"
    result: ClassVar[object] = int | None

    def command(self, layout: HostLayout) -> str:
        return f'p={path(self.where)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p"'

    def process(self, lines: list[str]) -> int | None:
        rows = [line.split() for line in lines[1:] if line.strip()]
        if not rows or len(rows[-1]) < 4 or not rows[-1][3].isdigit():
            return None
        return int(rows[-1][3]) * 1024

    def default(self) -> int | None:
        return None


class ListeningPorts(Fact[list[int]]):
    """TCP ports something listens on, from `/proc/net/tcp{,6}` (state 0A), sorted."""

    name = "host.ListeningPorts"
    result = list[int]

    def command(self, layout: HostLayout) -> str:
        return "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"

    def process(self, lines: list[str]) -> list[int]:
        ports: set[int] = set()
        for line in lines:
            cols = line.split()
            if len(cols) > 3 and cols[3] == "0A" and ":" in cols[1]:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        return sorted(ports)

    def default(self) -> list[int]:
        return []


@dataclass(frozen=True)
class PortHolder:
    """One listening socket on a port: the process behind it where `ss -p` may show it, and its deployment."""

    port: int
    pid: int | None = None
    command: str = ""
    deployment: str | None = None  # PDCTL_DEPLOYMENT in its environment, where /proc/PID/environ is readable


@dataclass(frozen=True)
class PortHolders(Fact[list[PortHolder] | None]):
    """Who listens on `ports`: `ss -Hltnp` (iproute2) and each holder's PDCTL_DEPLOYMENT marker; None without ss."""

    ports: tuple[int, ...]
    name: ClassVar[str] = "host.PortHolders"
    result: ClassVar[object] = list[PortHolder] | None
    requires_command: ClassVar[str | None] = "ss"

    def command(self, layout: HostLayout) -> str:
        where = " or ".join(f"sport = :{p}" for p in self.ports)
        return (
            f"out=$(ss -Hltnp '( {where} )'); printf '%s\\n' \"$out\" | sed -n 's/^LISTEN/ss LISTEN/p'; "
            "for pid in $(printf '%s\\n' \"$out\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do "
            "echo \"env $pid $(tr '\\0' '\\n' < /proc/$pid/environ 2>/dev/null | grep -m1 '^PDCTL_DEPLOYMENT=' "
            "| cut -d= -f2-)\"; done"
        )

    def process(self, lines: list[str]) -> list[PortHolder] | None:
        marks = {int(w[1]): w[2] for w in (ln.split() for ln in lines) if len(w) == 3 and w[0] == "env"
                 and w[1].isdigit()}
        found: list[PortHolder] = []
        for line in lines:
            cols = line.split()
            if len(cols) < 5 or cols[0] != "ss" or not cols[4].rsplit(":", 1)[-1].isdigit():
                continue
            port = int(cols[4].rsplit(":", 1)[-1])
            users = re.findall(r'\("([^"]*)",pid=(\d+)', line)
            found += [PortHolder(port, int(pid), comm, marks.get(int(pid))) for comm, pid in users] or [
                PortHolder(port)]
        return sorted(set(found), key=lambda h: (h.port, h.pid or 0))

    def default(self) -> list[PortHolder] | None:
        return None


class BootId(Fact[str]):
    """The kernel's boot id: it changes exactly when the host has rebooted."""

    name = "host.BootId"
    result = str

    def command(self, layout: HostLayout) -> str:
        return f"cat {layout.sys('/proc/sys/kernel/random/boot_id')}"

    def process(self, lines: list[str]) -> str:
        return lines[0].strip() if lines else ""

    def default(self) -> str:
        return ""
