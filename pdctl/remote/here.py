"""Whether an address, or a process on a host, is on the machine pdctl runs on.

An address is this machine's when it is a loopback address or one a socket here can bind to (the kernel allows
that only for addresses of this host's interfaces). A process listening at `address` on a host is on this
machine when the host is (local transport), or, for an SSH host reached without a jump host, when `address` is
a non-loopback address of this machine or a loopback one and the SSH connection goes to this machine.
"""

from __future__ import annotations

import ipaddress
import socket

from pdctl.remote.base import Transport
from pdctl.remote.local import LocalTransport
from pdctl.remote.ssh import SshTransport


def _resolved(address: str) -> list[tuple[int, str]]:
    try:
        infos = socket.getaddrinfo(address.strip("[]"), None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos]


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip.split("%")[0]).is_loopback
    except ValueError:
        return False


def _bindable(family: int, ip: str) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
    except OSError:
        return False
    return True


def is_here(address: str) -> bool:
    """`address` (a name or an IP) reaches this machine from this machine."""
    return any(_loopback(ip) or _bindable(family, ip) for family, ip in _resolved(address))


def is_loopback(address: str) -> bool:
    resolved = _resolved(address)
    return bool(resolved) and all(_loopback(ip) for _, ip in resolved)


def listens_here(transport: Transport, address: str) -> bool:
    """A process on `transport`'s host listening at `address` is on this machine (reachable as is, from here)."""
    if isinstance(transport, LocalTransport):
        return True
    if not isinstance(transport, SshTransport):
        return False
    hop = transport.target
    if hop.proxy_jump is not None or hop.proxy_command is not None:
        return False  # `address` is in the jump host's network, whatever it would mean here
    if is_loopback(address):  # the SSH host's own loopback: here only when that host is this machine
        return is_here(hop.hostname)
    return is_here(address)
