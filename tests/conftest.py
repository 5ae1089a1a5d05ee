"""Fixtures every test area shares. Area-specific fixtures live in that area's own conftest.py."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port() -> Callable[[], int]:
    return free_port
