"""Free loopback ports, without pytest: the benchmark scripts take their ports here too."""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and not one this process handed out before.

    The kernel may give the same ephemeral port to two binds in a row once the first socket is closed, and a
    topology asks for several ports before anything listens on them (seen in CI: port == side_channel_port).
    """
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
