"""Before anything starts: every host reachable (connecting proves it), ports free, GPUs present for vLLM."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pdctl.errors import LaunchError
from pdctl.facts.base import Fact, HostLayout, gather, layout_for, layouts_from_env, read
from pdctl.facts.gpu import Gpus, NvidiaSmi
from pdctl.facts.host import ListeningPorts, PortHolder, PortHolders
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
    busy = {s.name: [p for p in s.ports if p in found[s.node][0]] for s in to_start}
    held = _holders(to_start, busy, hosts, layouts)
    problems: list[str] = []
    hints: list[str] = []  # one per kind of problem, in the order met
    for spec in to_start:
        _, gpus = found[spec.node]
        for p in busy[spec.name]:
            problems.append(f"{spec.node}: port {p} needed by {spec.name} is in use "
                            f"{holder_words(topo, spec.node, p, held[spec.node, p])}")
            hints.append(port_hint(topo, spec, p, held[spec.node, p]))
        if gpus is not None and spec.gpus:
            have = {g.index for g in gpus.gpus}
            missing = sorted(set(spec.gpus) - have)
            if missing:
                why = f" ({gpus.error})" if gpus.error else f" (the node has {sorted(have) or 'none'})"
                problems.append(f"{spec.node}: GPU {', '.join(map(str, missing))} for {spec.name} not found{why}")
                hints.append(gpu_hint(spec, gpus))
    if problems:
        raise LaunchError("preflight failed:\n  " + "\n  ".join(problems), hint="; ".join(dict.fromkeys(hints)))


def port_hint(topo: Topology, spec: ProcessSpec, port: int, holders: list[PortHolder] | None) -> str:
    """The fix for a busy port, by who holds it: this deployment (`down` this one), another pdctl deployment
    (`down` that one), or any other process (stop it, or move the port)."""
    named = {h.pid: h for h in holders or [] if h.port == port and h.pid is not None}.values()
    owners = sorted({h.deployment for h in named if h.deployment})
    move = f"or give {spec.name} another port in {topo.file}"
    if topo.name in owners:
        return f"`pdctl down -t {topo.file}` stops what is left of {topo.name}, then `pdctl up` starts it afresh"
    if owners:
        them = ", ".join(f"`{o}`" for o in owners)
        return f"stop deployment {them} (`pdctl down -t <its topology file>`) {move}"
    pids = ", ".join(str(h.pid) for h in named)
    return f"stop {f'pid {pids}' if pids else 'what listens on it'} on {spec.node} {move}"


def gpu_hint(spec: ProcessSpec, gpus: Gpus) -> str:
    """The fix for a GPU `up` cannot find: the driver, when nvidia-smi fails; else the topology's indices."""
    if gpus.error:
        return f"`nvidia-smi` fails on {spec.node}: install or repair the NVIDIA driver there, then `pdctl doctor`"
    if not gpus.gpus:
        return f"{spec.node} shows no GPU (`nvidia-smi -L` there): place {spec.name} on a node with GPUs"
    return (f"set the gpus of {spec.name} to indices {spec.node} has "
            f"({', '.join(str(g.index) for g in gpus.gpus)}; `nvidia-smi -L` there lists them)")


def _holders(
    specs: Sequence[ProcessSpec], busy: Mapping[str, list[int]], hosts: Mapping[str, Transport],
    layouts: Mapping[str, HostLayout],
) -> dict[tuple[str, int], list[PortHolder] | None]:
    """(node, busy port) -> who holds it, read with `ss` over the node's transport (None: `ss` is missing)."""
    ports: dict[str, set[int]] = {}
    for spec in specs:
        ports.setdefault(spec.node, set()).update(busy[spec.name])
    wanted = {n: tuple(sorted(p)) for n, p in ports.items() if p}
    seen = parallel(list(wanted), lambda n: read(hosts[n], PortHolders(wanted[n]), layout_for(layouts, n)))
    return {(n, p): seen[n] for n, ps in wanted.items() for p in ps}


def holder_words(topo: Topology, node: str, port: int, holders: list[PortHolder] | None) -> str:
    """`by pid 4711 (python3)`, with the pdctl deployment it belongs to and the command that stops it."""
    if holders is None:
        return (f"by a process pdctl cannot name (iproute2's `ss` is not on {node}; "
                f"`sudo lsof -iTCP:{port} -sTCP:LISTEN` there shows it)")
    named = list({h.pid: h for h in holders if h.port == port and h.pid is not None}.values())
    if not named:
        return f"by a process pdctl cannot see (run `sudo ss -ltnp 'sport = :{port}'` on {node})"
    words = []
    for h in named:
        text = f"by pid {h.pid} ({h.command})"
        if h.deployment == topo.name:
            text += (f", a process of this deployment ({topo.name}): `pdctl status -t {topo.file}` shows it, "
                     f"`pdctl down -t {topo.file}` stops it")
        elif h.deployment:
            text += (f" of pdctl deployment `{h.deployment}`: `pdctl status -t <its topology file>` shows it, "
                     "`pdctl down -t <its topology file>` stops it")
        words.append(text)
    return "; ".join(words)


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
