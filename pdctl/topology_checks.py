"""Cross-field rules of a topology that a schema alone cannot express.

`check()` returns every violation as (location, message, hint); `topology_file` turns locations into lines.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from pdctl.topology import Topology

Finding = tuple[tuple[str | int, ...], str, str]


def check(topo: Topology) -> list[Finding]:
    return [
        *_node_references(topo),
        *_ports(topo),
        *_gpus(topo),
        *_role_agreement(topo),
        *_router_ttl(topo),
        *_python(topo),
    ]


def _node_references(topo: Topology) -> Iterator[Finding]:
    names = [n.name for n in topo.nodes]
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield ("nodes", i, "name"), f"node name `{name}` is used twice", "give every node its own name"
        seen.add(name)
    refs: list[tuple[tuple[str | int, ...], str]] = [(("router", "node"), topo.router.node)]
    for role, i, inst in topo.instances():
        refs.append(((role, i, "node"), inst.node))
    for loc, ref in refs:
        if ref not in seen:
            close = difflib.get_close_matches(ref, names, n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"nodes are: {', '.join(names)}"
            yield loc, f"no node named `{ref}`", hint


def _ports(topo: Topology) -> Iterator[Finding]:
    taken: dict[tuple[str, int], str] = {}

    def claim(node: str, port: int, owner: str, loc: tuple[str | int, ...]) -> Iterator[Finding]:
        other = taken.get((node, port))
        if other is not None:
            yield loc, f"port {port} on node `{node}` is already used by {other}", "give each process its own port"
        else:
            taken[(node, port)] = owner

    yield from claim(topo.router.node, topo.router.port, "router.port", ("router", "port"))
    for role, i, inst in topo.instances():
        yield from claim(inst.node, inst.port, f"{role}[{i}].port", (role, i, "port"))
    for role, i, inst in topo.instances():
        base = inst.side_channel_port
        for rank in range(inst.data_parallel_size):
            owner = f"{role}[{i}].side_channel_port (base {base} + rank {rank})"
            for finding in claim(inst.node, base + rank, owner, (role, i, "side_channel_port")):
                loc, message, _ = finding
                yield loc, message, (
                    "NIXL listens on side_channel_port + data-parallel rank; "
                    "space the instances' side-channel ports apart"
                )
                break


def _gpus(topo: Topology) -> Iterator[Finding]:
    owners: dict[tuple[str, int], str] = {}
    for role, i, inst in topo.instances():
        node = topo.node(inst.node) if inst.node in {n.name for n in topo.nodes} else None
        for gpu in inst.gpus:
            other = owners.get((inst.node, gpu))
            if other is not None:
                yield (role, i, "gpus"), f"GPU {gpu} of node `{inst.node}` is already given to {other}", (
                    "give each instance its own GPUs"
                )
            owners[(inst.node, gpu)] = f"{role}[{i}]"
            if node is not None and node.gpus and gpu >= node.gpus:
                yield (role, i, "gpus"), f"GPU {gpu} does not exist: node `{node.name}` has {node.gpus}", (
                    f"use ids 0..{node.gpus - 1}"
                )
        needed = inst.tp * inst.data_parallel_size
        if topo.engine == "vllm" and needed > len(inst.gpus):
            yield (role, i, "tp"), f"tp={inst.tp} x data_parallel_size={inst.data_parallel_size} needs "\
                f"{needed} GPUs but {len(inst.gpus)} are given", "list more gpus or lower tp"


def _role_agreement(topo: Topology) -> Iterator[Finding]:
    """Prefill and decode must agree on everything the KV handshake compares."""
    first_role, first_i, first = topo.instances()[0]
    base_model = topo.model_for(first)
    base_conn = topo.connector_for(first)
    for role, i, inst in topo.instances()[1:]:
        model, conn = topo.model_for(inst), topo.connector_for(inst)
        ref = f"{first_role}[{first_i}]"
        for key in ("id", "dtype", "block_size"):
            if getattr(model, key) != getattr(base_model, key):
                yield (role, i, "model", key), (
                    f"model {key} {getattr(model, key)!r} differs from {ref}'s {getattr(base_model, key)!r}"
                ), "prefill and decode must serve the same model, dtype and block size"
        if conn.bidirectional_kv_xfer != base_conn.bidirectional_kv_xfer:
            yield (role, i, "connector", "bidirectional_kv_xfer"), (
                f"bidirectional_kv_xfer is {conn.bidirectional_kv_xfer} here but "
                f"{base_conn.bidirectional_kv_xfer} on {ref}"
            ), "set it the same on prefill and decode (connector.bidirectional_kv_xfer)"


def _router_ttl(topo: Topology) -> Iterator[Finding]:
    ttls = [topo.connector_for(d).decoder_kv_blocks_ttl for d in topo.decode]
    if topo.router.handle_ttl >= min(ttls):
        yield ("router", "handle_ttl"), (
            f"handle_ttl {topo.router.handle_ttl:g}s is not below decoder_kv_blocks_ttl {min(ttls)}s"
        ), "the router must drop a handle before the decode frees its blocks; e.g. 30 s below"


def _python(topo: Topology) -> Iterator[Finding]:
    if topo.python.venv is not None:
        return
    for i, node in enumerate(topo.nodes):
        if node.transport != "local":
            yield ("nodes", i, "transport"), f"node `{node.name}` is reached over ssh but python.venv is null", (
                "set python.venv to a path on the nodes"
            )
