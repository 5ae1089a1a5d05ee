"""httpx transports whose connections are SSH `direct-tcpip` channels over a connection pdctl already holds.

The node's sshd opens the TCP connection on the node's side, so pdctl never needs a route to the node's
address: health checks, metrics, `/stats` and the bench reach engines and the router exactly as a process on
the node would. Channels are pooled by httpcore (keep-alive), so one channel serves many requests.
A dropped SSH connection surfaces as an httpx error naming the host and the hop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import httpcore
import httpx
import paramiko

SshConnection = Callable[[], paramiko.Transport | None]
"""Returns the live paramiko transport of the host (None when it is gone)."""

KEEPALIVE_S = 30.0
SYNC_LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_S)
ASYNC_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)


def _open(connection: SshConnection, label: str, host: str, port: int, timeout: float | None) -> paramiko.Channel:
    transport = connection()
    if transport is None or not transport.is_active():
        raise httpcore.ConnectError(f"{host}:{port}: the SSH connection to {label} is closed")
    try:
        return transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
    except paramiko.ChannelException as exc:
        raise httpcore.ConnectError(f"{host}:{port} refused via SSH to {label}: {exc.text}") from None
    except paramiko.SSHException as exc:
        if "Timeout" in str(exc):
            raise httpcore.ConnectTimeout(f"{host}:{port}: no channel via SSH to {label} in {timeout}s") from None
        raise httpcore.ConnectError(f"{host}:{port} via SSH to {label}: {exc}") from None
    except (EOFError, OSError) as exc:
        raise httpcore.ConnectError(f"{host}:{port}: the SSH connection to {label} dropped ({exc})") from None


class _Channel:
    """What the sync and async streams share: the channel, its readability and the dropped-connection check."""

    def __init__(self, chan: paramiko.Channel, label: str) -> None:
        self.chan = chan
        self.label = label

    def readable(self) -> bool:
        return bool(self.chan.recv_ready() or self.chan.eof_received or self.chan.closed)

    def recv(self, max_bytes: int) -> bytes:
        data = self.chan.recv(max_bytes)
        transport = self.chan.get_transport()
        if not data and (transport is None or not transport.is_active()):
            raise httpcore.ReadError(f"the SSH connection to {self.label} dropped")
        return bytes(data)

    def send(self, buffer: bytes) -> None:
        try:
            self.chan.sendall(buffer)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise httpcore.WriteError(f"the SSH connection to {self.label} dropped ({exc})") from None

    def extra(self, info: str) -> Any:
        return self.readable() if info == "is_readable" else None


class _Stream(httpcore.NetworkStream):
    def __init__(self, chan: paramiko.Channel, label: str) -> None:
        self._c = _Channel(chan, label)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._c.chan.settimeout(timeout)
        try:
            return self._c.recv(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout(f"no answer via SSH to {self._c.label} in {timeout}s") from None

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._c.chan.settimeout(timeout)
        self._c.send(buffer)

    def close(self) -> None:
        self._c.chan.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("https to a node through SSH is not supported (the channel is private)")

    def get_extra_info(self, info: str) -> Any:
        return self._c.extra(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, connection: SshConnection, label: str) -> None:
        self.connection, self.label = connection, label

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _Stream(_open(self.connection, self.label, host, port, timeout), self.label)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not reachable through SSH channels")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


class _AsyncStream(httpcore.AsyncNetworkStream):
    """Reads wait on the channel's pipe fd in the event loop (no thread per stream); writes are short."""

    def __init__(self, chan: paramiko.Channel, label: str) -> None:
        self._c = _Channel(chan, label)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self._c.readable():
            loop = asyncio.get_running_loop()
            fd = self._c.chan.fileno()
            while not self._c.readable():
                ready: asyncio.Future[None] = loop.create_future()
                loop.add_reader(fd, _wake, ready)
                try:
                    await asyncio.wait_for(ready, timeout)
                except TimeoutError:
                    raise httpcore.ReadTimeout(f"no answer via SSH to {self._c.label} in {timeout}s") from None
                finally:
                    loop.remove_reader(fd)
        return self._c.recv(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._c.chan.settimeout(timeout)
        await asyncio.to_thread(self._c.send, buffer)

    async def aclose(self) -> None:
        self._c.chan.close()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("https to a node through SSH is not supported (the channel is private)")

    def get_extra_info(self, info: str) -> Any:
        return self._c.extra(info)


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, connection: SshConnection, label: str) -> None:
        self.connection, self.label = connection, label

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        chan = await asyncio.to_thread(_open, self.connection, self.label, host, port, timeout)
        return _AsyncStream(chan, self.label)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not reachable through SSH channels")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class SshHttpTransport(httpx.HTTPTransport):
    """httpx's own transport (its error mapping, streaming, limits) over a pool of SSH channels."""

    def __init__(self, connection: SshConnection, label: str, limits: httpx.Limits | None = None) -> None:
        super().__init__()
        # The one swap httpx has no argument for: the pool's network backend.
        self._pool = httpcore.ConnectionPool(**_pool_limits(limits or SYNC_LIMITS),
                                             network_backend=_Backend(connection, label))


class AsyncSshHttpTransport(httpx.AsyncHTTPTransport):
    def __init__(self, connection: SshConnection, label: str, limits: httpx.Limits | None = None) -> None:
        super().__init__()
        self._pool = httpcore.AsyncConnectionPool(**_pool_limits(limits or ASYNC_LIMITS),
                                                  network_backend=_AsyncBackend(connection, label))


def _pool_limits(limits: httpx.Limits) -> dict[str, Any]:
    """httpx's limits as httpcore's pool arguments."""
    return {"max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry}


class Shared(httpx.BaseTransport):
    """A pooled transport lent to short-lived clients: their `close()` leaves the pool to its owner."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        return None
