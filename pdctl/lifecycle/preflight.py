"""Before anything starts: every host reachable (connecting proves it), ports free, GPUs present for vLLM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdctl.errors import LaunchError
from pdctl.facts.base import Fact, gather, layout_for, layouts_from_env
from pdctl.facts.gpu import Gpus, NvidiaSmi
from pdctl.facts.host import ListeningPorts
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.topology import Topology


def preflight(
    topo: Topology, to_start: Sequence[ProcessSpec], hosts: Mapping[str, Transport], api_key: str | None = None
) -> None:
    """Raise LaunchError listing every port in use and every missing GPU among the processes about to start,
    and a router whose `api_key_env` it would not find (it would refuse to start, or the smoke test get 401)."""
    nodes = sorted({s.node for s in to_start})
    if not nodes:
        return
    _api_key(topo, to_start, api_key)
    layouts = layouts_from_env()
    want_gpus = topo.engine == "vllm"

    def probe(node: str) -> tuple[list[int], Gpus | None]:
        facts: list[Fact[Any]] = [ListeningPorts(), *([NvidiaSmi()] if want_gpus else [])]
        values = gather(hosts[node], facts, layout_for(layouts, node))
        return values[facts[0].key()], values[facts[1].key()] if want_gpus else None

    found = parallel(nodes, probe)
    problems: list[str] = []
    for spec in to_start:
        listening, gpus = found[spec.node]
        busy = [p for p in spec.ports if p in listening]
        if busy:
            problems.append(f"{spec.node}: port {', '.join(map(str, busy))} needed by {spec.name} is in use")
        if gpus is not None and spec.gpus:
            have = {g.index for g in gpus.gpus}
            missing = sorted(set(spec.gpus) - have)
            if missing:
                why = f" ({gpus.error})" if gpus.error else f" (the node has {sorted(have) or 'none'})"
                problems.append(f"{spec.node}: GPU {', '.join(map(str, missing))} for {spec.name} not found{why}")
    if problems:
        raise LaunchError(
            "preflight failed:\n  " + "\n  ".join(problems),
            hint=f"free the ports (a previous deployment? `pdctl down -t {topo.file}` for {topo.name}) "
            "or change them in the topology",
        )


def _api_key(topo: Topology, to_start: Sequence[ProcessSpec], api_key: str | None) -> None:
    name = topo.router.api_key_env
    if not name or api_key is not None or not any(s.role == "router" for s in to_start):
        return
    node = topo.node(topo.router.node)
    if node.transport == "local":
        where = f"neither env.router nor env.all sets {name}, and it is not set where pdctl runs"
        fix = f"export {name}=<key> before `pdctl up`, or set env.router.{name}"
    else:
        where = f"env.router and env.all do not set {name}, and the router on `{node.name}` (ssh) does not get " \
            "pdctl's own environment"
        fix = f"set env.router.{name} (its value is shown as *** everywhere)"
    raise LaunchError(f"router.api_key_env is {name} but the router would get no key: {where}", hint=fix)
