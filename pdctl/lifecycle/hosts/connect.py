"""Connecting to a topology's nodes: the transport each node asks for, opened in parallel, closed at the end.

This sits above `remote/` (the transports know hosts, not topologies) and `slurm/` (a node bound to a job is
reached through its steps).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from pdctl.errors import PdctlError
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.local import LocalTransport
from pdctl.remote.ssh import connect_ssh
from pdctl.remote.sshconnect import SshOptions
from pdctl.slurm.allocation import SlurmNode
from pdctl.slurm.transport import SlurmTransport
from pdctl.topology import Node

HostKey = tuple[str, str, str | None, int, str | None]


def connect(node: Node, options: SshOptions | None = None) -> Transport:
    """The transport the topology asks for; SSH connects now and raises ConnectError on failure."""
    if isinstance(node, SlurmNode):
        return SlurmTransport(node.name, node.jobid, node.slurm_node or node.address, node.deployment)
    if node.transport == "local":
        return LocalTransport(node.name)
    return connect_ssh(node, options or SshOptions.from_env())


@contextmanager
def connected(nodes: Iterable[Node], options: SshOptions | None = None) -> Iterator[dict[str, Transport]]:
    """Transports for `nodes` by node name, connected in parallel, one per distinct host, closed at the end."""
    with reachable(nodes, options, partial=False) as (hosts, _):
        yield hosts


@contextmanager
def reachable(
    nodes: Iterable[Node], options: SshOptions | None = None, *, partial: bool = True
) -> Iterator[tuple[dict[str, Transport], dict[str, PdctlError]]]:
    """Like `connected`, but with `partial` the hosts that fail are returned as errors instead of raised."""
    by_key: dict[HostKey, list[Node]] = {}
    for n in nodes:
        by_key.setdefault((n.transport, n.address, n.user, n.port, n.ssh_alias), []).append(n)
    opened: dict[HostKey, Transport] = {}
    failed: dict[str, PdctlError] = {}

    def _open(key: HostKey) -> None:
        try:
            opened[key] = connect(by_key[key][0], options)
        except PdctlError as exc:
            if not partial:
                raise
            failed.update({n.name: exc for n in by_key[key]})

    try:
        parallel(by_key, _open)
        yield {n.name: opened[k] for k, group in by_key.items() for n in group if k in opened}, failed
    finally:
        for transport in opened.values():
            transport.close()
