"""What `up` does with each process of the plan: start it, keep it, replace it in place, or remove it; `up` and
`up --dry-run` take the same decision (`decide`), from the plan, the state file and what runs on the hosts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pdctl.errors import LaunchError
from pdctl.plan import ProcessSpec
from pdctl.remote.procs import HostProcess
from pdctl.state import DeploymentState, argv_hash
from pdctl.topology import Topology

SHARED_GPU_WHY = ("vLLM sizes its KV from the GPU memory free at start, and a peer keeps the memory of the engine "
                  "it talked to mapped (UCX cuda_ipc) until the peer itself stops: the replacement would not find "
                  "the memory it needs and the deployment would be left without it")
NOTHING_STOPPED = "Nothing was stopped"
SHARED_GPU_COST = "every engine stops, then starts; each conversation's next turn misses once"


@dataclass(frozen=True)
class Decision:
    """Per process of the plan, what `up` does: start it (not running), keep it (running, same argv), or
    `changed`: running with another argv, or not recorded in the state file (`up` refuses; `--restart`).

    Where the router takes live membership (its members file): a running engine with another argv is `replace`d
    in place (drained, stopped, started), a router with other settings too (restarted), and an engine running but
    no longer in the topology is `removed` (drained, then stopped); a router's new members restart nothing.
    Behind a load balancer, a router no longer in the topology (`router.replicas` lowered) is in
    `removed_routers`; the load balancer itself is never replaced (its reload is `routers_live.sync`'s)."""

    start: list[ProcessSpec]
    kept: list[str]
    changed: list[str]
    replace: list[ProcessSpec] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    removed_routers: list[str] = field(default_factory=list)  # behind the LB: drained there, reloaded out, stopped
    held: dict[str, str] = field(default_factory=dict)  # vLLM engines not replaceable live: name -> its peers, why


def _ucx(spec: ProcessSpec) -> bool:
    """Whether the engine moves KV with NIXL's UCX backend (on one node: cuda_ipc, a peer's KV mapped in)."""
    argv = list(spec.argv)
    if "--kv-transfer-config" not in argv:
        return False
    raw = argv[argv.index("--kv-transfer-config") + 1]
    try:
        config = json.loads(raw)
    except ValueError:
        return False
    backends = config.get("kv_connector_extra_config", {}).get("backends", []) if isinstance(config, dict) else []
    return "UCX" in backends


def gpu_peers(specs: Sequence[ProcessSpec], engine: str) -> dict[str, dict[str, str]]:
    """vLLM engines whose GPU memory another engine may hold: engine -> {peer: how}. Peers are engines of one
    node that share a GPU, or a prefill and a decode of one node that move KV over UCX (cuda_ipc maps the other's
    KV into the process, on another GPU of the node too). Simulated engines hold no GPU memory: none has peers."""
    if engine != "vllm":
        return {}
    engines = [s for s in specs if s.role in ("prefill", "decode")]
    peers: dict[str, dict[str, str]] = {}
    for a in engines:
        for b in engines:
            if a.name == b.name or a.node != b.node:
                continue
            shared = sorted(set(a.gpus) & set(b.gpus))
            if shared:
                how = f"shares GPU {', '.join(str(g) for g in shared)} of node `{a.node}` with {b.name}"
            elif a.role != b.role and _ucx(a) and _ucx(b):
                how = f"moves KV with {b.name} over UCX on node `{a.node}` (cuda_ipc)"
            else:
                continue
            peers.setdefault(a.name, {})[b.name] = how
    return peers


def _held(specs: Sequence[ProcessSpec], replace: Sequence[ProcessSpec],
          live: Mapping[str, dict[str, list[HostProcess]]], engine: str) -> dict[str, str]:
    """The engines to replace whose peers run: name -> how (`up` refuses them before it stops anything)."""
    peers = gpu_peers(specs, engine)
    nodes = {s.name: s.node for s in specs}
    held: dict[str, str] = {}
    for spec in replace:
        running = [how for peer, how in peers.get(spec.name, {}).items() if live.get(nodes[peer], {}).get(peer)]
        if running:
            held[spec.name] = "; ".join(running)
    return held


def live_membership(specs: Sequence[ProcessSpec]) -> bool:
    """Whether the deployment's router reads a members file (so engines can come and go under it)."""
    return any(s.role == "router" and "--members-file" in s.argv for s in specs)


def decide(
    specs: Sequence[ProcessSpec],
    state: DeploymentState,
    live: Mapping[str, dict[str, list[HostProcess]]],
    rolling: bool = False,
    *,
    engine: str,
) -> Decision:
    """Pure: `up`'s decision from the plan, the state file and what runs on the hosts (`--dry-run` shows it).
    `rolling` (`--restart --rolling`): every running engine is replaced, one at a time; so are the routers where
    a load balancer stands in front of several (each drained there first); the one router only where its settings
    changed: with no second router its restart ends its requests. The load balancer itself is kept."""
    decision = Decision([], [], [])
    members = live_membership(specs)
    behind_lb = any(s.role == "lb" for s in specs)
    for spec in specs:
        record = state.processes.get(spec.name)
        if not live[spec.node].get(spec.name, []):
            decision.start.append(spec)
        elif record is not None and members and rolling and (spec.role in ("prefill", "decode") or
                                                             (spec.role == "router" and behind_lb)):
            decision.replace.append(spec)
        elif record is not None and record.argv_hash == argv_hash(spec):
            decision.kept.append(spec.name)
        elif record is not None and members and spec.role != "lb":
            decision.replace.append(spec)
        else:
            decision.changed.append(spec.name)
    if members:
        planned = {s.name for s in specs}
        alive = sorted(name for name, r in state.processes.items()
                       if name not in planned and live.get(r.node, {}).get(name))
        decision.removed.extend(n for n in alive if state.processes[n].role in ("prefill", "decode"))
        routers = [n for n in alive if state.processes[n].role == "router"]
        if behind_lb and "router" not in routers:
            decision.removed_routers.extend(routers)
        else:  # one router <-> several behind a load balancer: both want router.port, no live path between them
            decision.changed.extend(routers)
    decision.held.update(_held(specs, decision.replace, live, engine))
    return decision


def refusal(topo: Topology, decision: Decision, rolling: bool = False) -> LaunchError | None:
    """Why `up` would not go through with `decision`, with the command that would; None when it would."""
    if decision.changed:
        return LaunchError(
            f"{topo.name}: {', '.join(decision.changed)} already running with other settings (or not recorded in "
            "the state file)",
            hint="restart the deployment with the new topology: `pdctl up --restart`",
        )
    if decision.held:
        reasons = "; ".join(f"{name} {how}" for name, how in decision.held.items())
        again = " without --rolling: " if rolling else ": "
        return LaunchError(
            f"{topo.name}: cannot replace {', '.join(decision.held)} while the deployment runs: {reasons}. "
            f"{SHARED_GPU_WHY}. {NOTHING_STOPPED}",
            hint=f"restart the deployment{again}`pdctl up -t {topo.file} --restart` ({SHARED_GPU_COST}), or "
                 f"`pdctl down -t {topo.file}` then `pdctl up -t {topo.file}`",
        )
    return None


def decide_or_refuse(
    topo: Topology,
    specs: Sequence[ProcessSpec],
    state: DeploymentState,
    live: Mapping[str, dict[str, list[HostProcess]]],
    rolling: bool = False,
) -> Decision:
    """Which specs must start; alive ones with the same argv are kept; alive with another argv is an error
    (unless the router's live membership lets them be replaced in place, and no running peer holds their GPU
    memory). Raised before anything is stopped."""
    decision = decide(specs, state, live, rolling, engine=topo.engine)
    error = refusal(topo, decision, rolling)
    if error is not None:
        raise error
    for spec in decision.start:
        state.processes.pop(spec.name, None)
    return decision
