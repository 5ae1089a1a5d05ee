"""Choosing a transport per node, and doing the same thing on many hosts at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from pdctl.errors import PdctlError
from pdctl.remote.base import Transport
from pdctl.remote.local import LocalTransport
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Node

K = TypeVar("K")
T = TypeVar("T")


def connect(node: Node, options: SshOptions | None = None) -> Transport:
    """The transport the topology asks for; SSH connects now and raises ConnectError on failure."""
    from pdctl.slurm.allocation import SlurmNode

    if isinstance(node, SlurmNode):
        from pdctl.slurm.transport import SlurmTransport

        return SlurmTransport(node.name, node.jobid, node.slurm_node or node.address, node.deployment)
    if node.transport == "local":
        return LocalTransport(node.name)
    from pdctl.remote.ssh import connect_ssh

    return connect_ssh(node, options or SshOptions.from_env())


def parallel(items: Iterable[K], fn: Callable[[K], T], max_workers: int = 16) -> dict[K, T]:
    """`fn` on every item in threads; results by item. Every item finishes before the first error is raised,
    with the others' messages appended, so no host is left half-done unnoticed."""
    keys = list(items)
    if not keys:
        return {}
    results: dict[K, T] = {}
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(keys))) as pool:
        futures = {k: pool.submit(fn, k) for k in keys}
        for k, fut in futures.items():
            try:
                results[k] = fut.result()
            except BaseException as exc:
                errors.append(exc)
    if errors:
        first = errors[0]
        if len(errors) > 1 and isinstance(first, PdctlError):
            more = "; ".join(str(e).splitlines()[0] for e in errors[1:])
            first.message = f"{first.message}\n(also: {more})"
            first.args = (first.message,)
        raise first
    return results


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
    node_list = list(nodes)
    by_key: dict[tuple[str, str, str | None, int, str | None], list[Node]] = {}
    for n in node_list:
        by_key.setdefault((n.transport, n.address, n.user, n.port, n.ssh_alias), []).append(n)
    opened: dict[tuple[str, str, str | None, int, str | None], Transport] = {}

    failed: dict[str, PdctlError] = {}

    def _open(key: tuple[str, str, str | None, int, str | None]) -> None:
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
