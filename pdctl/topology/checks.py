"""Cross-field rules of a topology that a schema alone cannot express.

`check()` returns every violation as (location, message, hint); `topology.file` turns locations into lines.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator

from pdctl.defaults import VLLM_DECODER_KV_BLOCKS_TTL_S
from pdctl.kv_expiry import ENGINE_EXPIRY_MARGIN_S, ROUTER_EXPIRY_MARGIN_S, ROUTER_SLACK_S, leaves_no_handle
from pdctl.topology.model import SHARED_GPU_LIMIT, Instance, Role, Topology

Finding = tuple[tuple[str | int, ...], str, str]


def check(topo: Topology) -> list[Finding]:
    return [
        *_node_references(topo),
        *_ports(topo),
        *_lb_headers(topo),
        *_gpus(topo),
        *_role_agreement(topo),
        *_router_ttl(topo),
        *_python(topo),
        *_slurm(topo),
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
    refs += [(("router", "replica_nodes", i), n) for i, n in enumerate(topo.router.replica_nodes or [])]
    for role, i, inst in _file_order(topo):
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

    # An aggregated topology does not run its prefills: their ports are free (its engines may take them).
    in_file_order = [x for x in _file_order(topo) if topo.mode != "aggregated" or x[0] == "decode"]
    for role, i, inst in in_file_order:
        yield from claim(inst.node, inst.port, f"{role}[{i}].port", (role, i, "port"))
    yield from claim(topo.router.node, topo.router.port, "router.port", ("router", "port"))
    yield from _replica_ports(topo, claim)
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


def _replica_ports(topo: Topology, claim: Callable[[str, int, str, tuple[str | int, ...]], Iterator[Finding]]
                   ) -> Iterator[Finding]:
    """router-i listens on replica_port + (its index among the routers of its node): each must fit and be free."""
    r = topo.router
    loc: tuple[str | int, ...] = ("router", "replica_port" if r.replica_port else "replicas")
    for i, (node, port) in enumerate(r.replica_places()):
        if node not in {n.name for n in topo.nodes}:
            continue  # reported as a missing node
        if port > 65535:
            yield loc, (f"router-{i} would listen on port {port} on node `{node}`: above 65535"), (
                "lower router.replica_port, spread the routers over more router.replica_nodes, or lower "
                "router.replicas")
            return
        for loc_, message, _ in claim(node, port, f"router-{i}", loc):
            yield loc_, message, (f"router-{i} needs port {port} on `{node}`: set router.replica_port to a range of "
                                  f"{r.replicas} free ports, or place the routers on other router.replica_nodes")
            return


_HEADER = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def _lb_headers(topo: Topology) -> Iterator[Finding]:
    """The load balancer's config names the conversation headers: they must be plain header names."""
    if topo.router.replicas < 2:
        return
    for i, h in enumerate(topo.router.conversation_headers or []):
        if not _HEADER.match(h):
            yield ("router", "conversation_headers", i), f"`{h}` is not a header name the load balancer can hash on", (
                "use letters, digits, `-` and `_` only (e.g. X-Conversation-Id)")


def _gpus(topo: Topology) -> Iterator[Finding]:
    running = {(role, i) for role, i, _ in topo.instances()}
    owners: dict[tuple[str, int], list[tuple[Role, int, Instance]]] = {}
    for role, i, inst in _file_order(topo):
        node = topo.node(inst.node) if inst.node in {n.name for n in topo.nodes} else None
        for gpu in inst.gpus:
            if node is not None and node.gpus and gpu >= node.gpus:
                yield (role, i, "gpus"), f"GPU {gpu} does not exist: node `{node.name}` has {node.gpus}", (
                    f"use ids 0..{node.gpus - 1}"
                )
            if (role, i) in running:
                owners.setdefault((inst.node, gpu), []).append((role, i, inst))
        needed = inst.tp * inst.data_parallel_size
        if topo.engine == "vllm" and needed > len(inst.gpus):
            yield (role, i, "tp"), f"tp={inst.tp} x data_parallel_size={inst.data_parallel_size} needs "\
                f"{needed} GPUs but {len(inst.gpus)} are given", "list more gpus or lower tp"
    for (node_name, gpu), sharing in owners.items():
        if len(sharing) > 1:
            yield from _shared_gpu(topo, node_name, gpu, sharing)


def _shared_gpu(
    topo: Topology, node: str, gpu: int, sharing: list[tuple[Role, int, Instance]]
) -> Iterator[Finding]:
    """One GPU may serve several instances when each caps its memory and the caps leave the GPU some room."""
    first = f"{sharing[0][0]}[{sharing[0][1]}]"
    shares = [topo.model_for(inst).gpu_memory_utilization for _, _, inst in sharing]
    limit = f"{SHARED_GPU_LIMIT:g}"
    if any(share is None for share in shares):
        for role, i, _ in sharing[1:]:
            yield (role, i, "gpus"), f"GPU {gpu} of node `{node}` is already given to {first}", (
                "give each instance its own GPUs, or share this one: set model.gpu_memory_utilization so that "
                f"the instances on it sum below {limit} (e.g. 0.45 each)"
            )
        return
    total = sum(s for s in shares if s is not None)
    if total >= SHARED_GPU_LIMIT:
        role, i, _ = sharing[-1]
        names = ", ".join(f"{r}[{n}]" for r, n, _ in sharing)
        yield (role, i, "gpus"), (
            f"GPU {gpu} of node `{node}` is shared by {names}, whose gpu_memory_utilization sums to {total:g}, "
            f"not below {limit}"
        ), f"lower model.gpu_memory_utilization (e.g. {SHARED_GPU_LIMIT / len(sharing) - 0.025:.2f} each)"


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
    if leaves_no_handle(ttl):
        override = topo.decode[index].connector
        own = override is not None and override.decoder_kv_blocks_ttl is not None
        loc: tuple[str | int, ...] = ("decode", index, "connector", "decoder_kv_blocks_ttl") if own else (
            "connector", "decoder_kv_blocks_ttl")
        yield loc, (
            f"decoder_kv_blocks_ttl {ttl}s leaves no usable handle: the router stops using a handle "
            f"{ROUTER_EXPIRY_MARGIN_S:g}s before the decode frees its blocks (the engine declines reads within "
            f"{ENGINE_EXPIRY_MARGIN_S:g}s, plus {ROUTER_SLACK_S:g}s for the request in flight)"
        ), (
            f"set decoder_kv_blocks_ttl well above {ROUTER_EXPIRY_MARGIN_S:g}s (default "
            f"{VLLM_DECODER_KV_BLOCKS_TTL_S}) and handle_ttl below it"
        )


def _python(topo: Topology) -> Iterator[Finding]:
    if topo.python.no_deps and not topo.python.wheelhouse:
        yield ("python", "no_deps"), "no_deps installs the wheels of python.wheelhouse, which is not set", (
            "set python.wheelhouse to a folder of wheels, or remove no_deps"
        )
    for i, node in enumerate(topo.nodes):
        # Slurm hosts share the login node's filesystem (the usual cluster setup), so its interpreter works there
        if node.transport != "local" and topo.slurm is None and topo.venv_for(node.name) is None:
            yield ("nodes", i, "transport"), f"node `{node.name}` is reached over ssh but python.venv is null", (
                "set python.venv (or this node's venv) to a path on the nodes"
            )


def _slurm(topo: Topology) -> Iterator[Finding]:
    """Nodes map onto the allocation's hosts: explicit `slurm_node`s first, the rest in order."""
    if topo.slurm is None:
        for i, node in enumerate(topo.nodes):
            if node.slurm_node is not None:
                yield ("nodes", i, "slurm_node"), "slurm_node without a `slurm:` block", (
                    "add a `slurm:` block or remove slurm_node"
                )
        return
    slurm = topo.slurm
    named = [n.slurm_node for n in topo.nodes if n.slurm_node is not None]
    needed = len(set(named)) + sum(1 for n in topo.nodes if n.slurm_node is None)
    for i, node in enumerate(topo.nodes):
        if "transport" in node.model_fields_set and node.transport == "local":
            yield ("nodes", i, "transport"), "a node of a Slurm topology is reached through srun, not locally", (
                "remove `transport` from the node"
            )
        if node.slurm_node is not None and slurm.nodelist and node.slurm_node not in slurm.nodelist:
            close = difflib.get_close_matches(node.slurm_node, slurm.nodelist, n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"slurm.nodelist is: {', '.join(slurm.nodelist)}"
            yield ("nodes", i, "slurm_node"), f"`{node.slurm_node}` is not in slurm.nodelist", hint
    if slurm.jobid is not None:
        return
    if topo.engine == "vllm" and slurm.gres is None and slurm.gpus_per_node is None:
        yield ("slurm",), "the job requests no GPUs, so its steps get none", (
            "set slurm.gpus_per_node (or slurm.gres, e.g. gpu:8)"
        )
    if slurm.nodes is not None and slurm.nodes < needed:
        yield ("slurm", "nodes"), f"{slurm.nodes} host(s) for {needed} topology node(s) on distinct hosts", (
            f"allocate at least {needed}, or put nodes on one host with the same slurm_node"
        )
    if slurm.nodelist is not None and slurm.nodes is None and len(slurm.nodelist) < needed:
        yield ("slurm", "nodelist"), f"{len(slurm.nodelist)} host(s) listed for {needed} topology node(s)", (
            f"list at least {needed} hosts"
        )
