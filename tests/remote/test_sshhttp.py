"""HTTP through a host's SSH connection: a server listening on the loopback of a namespaced host, which only a
process on that host can reach, answers pdctl's sync and async clients through `direct-tcpip` channels."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdctl.remote.ssh import SshTransport, connect_ssh
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Node
from tests.conftest import free_port
from tests.support.netns import SshLab

pytestmark = pytest.mark.ssh


@pytest.fixture
def host_only_server(lab: SshLab, tmp_path: Path) -> Iterator[tuple[SshTransport, str]]:
    """An http.server on 127.0.0.1 inside h1's namespace, and an SSH transport to h1."""
    (tmp_path / "hello.txt").write_text("hello from h1\n")
    port = free_port()
    proc = subprocess.Popen(
        ["ip", "netns", "exec", lab.hosts[0].netns, sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
         str(port), "--directory", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    h = lab.hosts[0]
    transport = connect_ssh(Node(name=h.node, address=h.address, ssh_alias=h.node),
                            SshOptions(ssh_config=lab.ssh_config(), known_hosts=lab.known_hosts()))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        with httpx.Client(transport=transport.http(), timeout=2) as client:
            while True:
                try:
                    client.get(url)
                    break
                except httpx.ConnectError:
                    assert time.monotonic() < deadline, "http.server in h1's namespace did not start"
                    time.sleep(0.1)
        yield transport, url
    finally:
        proc.terminate()
        proc.wait(10)
        transport.close()


def test_requests_travel_over_pooled_ssh_channels(host_only_server: tuple[SshTransport, str]) -> None:
    transport, url = host_only_server
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # nothing listens on this port here: only h1 itself can reach its loopback
    with httpx.Client(transport=transport.http(), timeout=5) as client:
        first = client.get(f"{url}/hello.txt")
        second = client.get(f"{url}/hello.txt")
    assert first.status_code == second.status_code == 200 and first.text == "hello from h1\n"
    with httpx.Client(transport=transport.http(), timeout=5) as client:
        assert client.get(f"{url}/hello.txt").text == "hello from h1\n"  # the shared pool outlives each client

    async def fetch() -> list[str]:
        async with httpx.AsyncClient(transport=transport.async_http(), timeout=5) as client:
            replies = await asyncio.gather(*(client.get(f"{url}/hello.txt") for _ in range(4)))
            async with client.stream("GET", f"{url}/hello.txt") as resp:
                streamed = b"".join([chunk async for chunk in resp.aiter_bytes()]).decode()
        return [r.text for r in replies] + [streamed]

    assert asyncio.run(fetch()) == ["hello from h1\n"] * 5


def test_a_closed_port_and_a_dropped_connection_name_the_host(host_only_server: tuple[SshTransport, str]) -> None:
    transport, url = host_only_server
    dead = free_port()
    with httpx.Client(transport=transport.http(), timeout=5) as client, pytest.raises(httpx.ConnectError) as info:
        client.get(f"http://127.0.0.1:{dead}/")
    assert str(info.value) == f"127.0.0.1:{dead} refused via SSH to h1 (root@{transport.target.hostname}): " \
        "Connect failed"
    transport.client.close()
    with httpx.Client(transport=transport.http(), timeout=5) as client, pytest.raises(httpx.ConnectError) as info:
        client.get(f"{url}/hello.txt")
    assert str(info.value) == f"127.0.0.1:{url.rsplit(':', 1)[1]}: the SSH connection to h1 " \
        f"(root@{transport.target.hostname}) is closed"
