"""Cross-field rules of a topology that a schema alone cannot express.

`check()` returns every violation as (location, message, hint); `topology_file` turns locations into lines.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from pdctl.kv_expiry import ENGINE_EXPIRY_MARGIN_S, ROUTER_EXPIRY_MARGIN_S, ROUTER_SLACK_S, handle_lifetime
from pdctl.topology import Instance, Role, Topology

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


def _file_order(topo: Topology) -> list[tuple[Role, int, Instance]]:
    """Instances as a reader meets them (prefill, then decode), so the later duplicate is the one flagged."""
    return [("prefill", i, p) for i, p in enumerate(topo.prefill)] + [
        ("decode", i, d) for i, d in enumerate(topo.decode)
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

    in_file_order = _file_order(topo)
    for role, i, inst in in_file_order:
        yield from claim(inst.node, inst.port, f"{role}[{i}].port", (role, i, "port"))
    yield from claim(topo.router.node, topo.router.port, "router.port", ("router", "port"))
    for role, i, inst in in_file_order:
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
    for role, i, inst in _file_order(topo):
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
    everyone = _file_order(topo)
    first_role, first_i, first = everyone[0]
    for role, i, inst in everyone[1:]:
        pairs = [
            ("model", key, getattr(topo.model_for(inst), key), getattr(topo.model_for(first), key))
            for key in ("id", "dtype", "block_size")
        ]
        pairs.append((
            "connector", "bidirectional_kv_xfer",
            topo.connector_for(inst).bidirectional_kv_xfer, topo.connector_for(first).bidirectional_kv_xfer,
        ))
        for section, key, mine, theirs in pairs:
            if mine == theirs:
                continue
            # point at the instance whose own override makes the difference
            here, there = (role, i, inst), (first_role, first_i, first)
            if _overrides(first, section, key) and not _overrides(inst, section, key):
                here, there = there, here
                mine, theirs = theirs, mine
            what = "bidirectional_kv_xfer is" if key == "bidirectional_kv_xfer" else f"model {key}"
            yield (here[0], here[1], section, key), (
                f"{what} {mine!r} here but {theirs!r} on {there[0]}[{there[1]}]"
            ), (
                "set bidirectional_kv_xfer the same on prefill and decode"
                if key == "bidirectional_kv_xfer"
                else "prefill and decode must serve the same model, dtype and block size"
            )


def _overrides(inst: Instance, section: str, key: str) -> bool:
    part = getattr(inst, section)
    return part is not None and getattr(part, key) is not None


def _router_ttl(topo: Topology) -> Iterator[Finding]:
    """What `pdctl router serve` would refuse, refused here with the same numbers (pdctl.kv_expiry)."""
    index, ttl = topo.decode_kv_ttl()
    if topo.router.handle_ttl >= ttl:
        yield ("router", "handle_ttl"), (
            f"handle_ttl {topo.router.handle_ttl:g}s is not below decoder_kv_blocks_ttl {ttl}s"
        ), "the router must drop a handle before the decode frees its blocks; e.g. 30 s below"
    if handle_lifetime(topo.router.handle_ttl, ttl) <= 0:
        override = topo.decode[index].connector
        own = override is not None and override.decoder_kv_blocks_ttl is not None
        loc: tuple[str | int, ...] = ("decode", index, "connector", "decoder_kv_blocks_ttl") if own else (
            "connector", "decoder_kv_blocks_ttl")
        yield loc, (
            f"decoder_kv_blocks_ttl {ttl}s leaves no usable handle: the router stops using a handle "
            f"{ROUTER_EXPIRY_MARGIN_S:g}s before the decode frees its blocks (the engine declines reads within "
            f"{ENGINE_EXPIRY_MARGIN_S:g}s, plus {ROUTER_SLACK_S:g}s for the request in flight)"
        ), f"set decoder_kv_blocks_ttl well above {ROUTER_EXPIRY_MARGIN_S:g}s (default 480) and handle_ttl below it"


def _python(topo: Topology) -> Iterator[Finding]:
    if topo.python.no_deps and not topo.python.wheelhouse:
        yield ("python", "no_deps"), "no_deps installs the wheels of python.wheelhouse, which is not set", (
            "set python.wheelhouse to a folder of wheels, or remove no_deps"
        )
    for i, node in enumerate(topo.nodes):
        if node.transport != "local" and topo.venv_for(node.name) is None:
            yield ("nodes", i, "transport"), f"node `{node.name}` is reached over ssh but python.venv is null", (
                "set python.venv (or this node's venv) to a path on the nodes"
            )
