"""A local TCP port whose connections are carried to an address on a host's network (`ssh -L`, in-process).

Each accepted connection gets its own stream from `Transport.connect_tcp` (a `direct-tcpip` channel for SSH
hosts) and a thread pumping bytes both ways until either side closes. A connection the far side refuses is
closed at once and said on stderr; the forwarding stays up for the next one.
"""

from __future__ import annotations

import contextlib
import select
import socket
import sys
import threading

from pdctl.errors import PdctlError, UsageError
from pdctl.remote.base import Transport

CHUNK = 1 << 16


def listen(port: int, bind: str = "127.0.0.1") -> socket.socket:
    """The local end; a port in use is the user's to change (`--port`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {bind}:{port}: {exc.strerror}", hint="choose another with --port N") \
            from None
    sock.listen(64)
    return sock


def serve(listener: socket.socket, transport: Transport, host: str, port: int, stop: threading.Event) -> None:
    """Accept until `stop` is set; each connection reaches `host:port` through `transport`."""
    listener.settimeout(0.25)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        threading.Thread(target=_pipe, args=(conn, transport, host, port, stop), daemon=True).start()
    listener.close()


def _pipe(conn: socket.socket, transport: Transport, host: str, port: int, stop: threading.Event) -> None:
    try:
        remote = transport.connect_tcp(host, port, timeout=10.0)
    except (PdctlError, OSError) as exc:  # that client sees its connection closed; the tunnel stays up for others
        conn.close()
        why = str(exc) if isinstance(exc, PdctlError) else f"{transport.name}: {host}:{port}: {exc.strerror or exc}"
        sys.stderr.write(f"port-forward: {why}; that connection was closed\n")
        return
    with contextlib.closing(conn), contextlib.closing(remote):
        ends = {conn.fileno(): (conn, remote), remote.fileno(): (remote, conn)}
        while not stop.is_set():
            ready, _, _ = select.select(list(ends), [], [], 0.5)
            for fd in ready:
                src, dst = ends[fd]
                try:
                    data = src.recv(CHUNK)
                    if not data:
                        return
                    dst.sendall(data)
                except OSError:
                    return
