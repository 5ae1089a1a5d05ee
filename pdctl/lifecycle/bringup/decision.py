"""What `up` does with each process of the plan: start it, keep it, replace it in place, or remove it; `up` and
`up --dry-run` take the same decision (`decide`), from the plan, the state file and what runs on the hosts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pdctl.errors import LaunchError
from pdctl.plan import ProcessSpec
from pdctl.remote.procs import HostProcess
from pdctl.state import DeploymentState, argv_hash


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


def live_membership(specs: Sequence[ProcessSpec]) -> bool:
    """Whether the deployment's router reads a members file (so engines can come and go under it)."""
    return any(s.role == "router" and "--members-file" in s.argv for s in specs)


def decide(
    specs: Sequence[ProcessSpec],
    state: DeploymentState,
    live: Mapping[str, dict[str, list[HostProcess]]],
    rolling: bool = False,
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
    return decision


def decide_or_refuse(
    deployment: str,
    specs: Sequence[ProcessSpec],
    state: DeploymentState,
    live: Mapping[str, dict[str, list[HostProcess]]],
    rolling: bool = False,
) -> Decision:
    """Which specs must start; alive ones with the same argv are kept; alive with another argv is an error
    (unless the router's live membership lets them be replaced in place)."""
    decision = decide(specs, state, live, rolling)
    if decision.changed:
        raise LaunchError(
            f"{deployment}: {', '.join(decision.changed)} already running with other settings (or not recorded in "
            "the state file)",
            hint="restart the deployment with the new topology: `pdctl up --restart`",
        )
    for spec in decision.start:
        state.processes.pop(spec.name, None)
    return decision
