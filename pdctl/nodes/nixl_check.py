"""After launch on EFA topologies: read the engines' NIXL log lines and say what is wrong with the transport.

NIXL logs through absl to stderr (reference efa-provisioning.md 2.5); pdctl sets NIXL_LOG_LEVEL so the rail
lines are there. A healthy p5en engine says `Created 16 rails using provider=efa` (NIXL >= 1.0) or
`Successfully created 16 data rails and ... control rails using provider=efa` (0.8-0.10).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from pdctl.errors import LaunchError
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport, expand_home
from pdctl.remote.hosts import parallel
from pdctl.topology import Topology

START_MARK = "=== pdctl: starting at"  # written by the launcher before every start (pdctl.remote.procs)
RAIL_NEEDLE = "rails using provider="
_RAILS = re.compile(r"(?:Created|Successfully created) (\d+) (?:data )?rails.*?using provider=(\w[\w-]*)")
_FAILURES = (
    ("TCP fallback", "NIXL fell back to TCP: libfabric found no EFA device"),
    ("No network devices found", "NIXL found no network device at all"),
    ("Topology discovery failed", "NIXL's topology discovery failed"),
    ("Using provider without FI_HMEM support", "the provider lacks FI_HMEM: no GPUDirect RDMA (efa_nv_peermem?)"),
    ("backend 'LIBFABRIC' not found", "NIXL's LIBFABRIC plugin did not load (libfabric not on LD_LIBRARY_PATH?)"),
)


def nixl_problems(log_text: str, expected_rails: int) -> list[str]:
    """What is wrong with one engine's NIXL transport, from its log; empty when it uses `expected_rails` EFA rails."""
    problems = [why for needle, why in _FAILURES if needle in log_text]
    rails = [(int(n), provider) for n, provider in _RAILS.findall(log_text)]
    if not rails:
        if not problems:
            problems.append("no NIXL rail line in the log (is NIXL_LOG_LEVEL at least INFO, the backend LIBFABRIC?)")
        return problems
    count, provider = min(rails)
    if provider != "efa":
        problems.append(f"NIXL rails use provider={provider}, not efa")
    elif count < expected_rails:
        problems.append(f"NIXL created {count} rails, fewer than the {expected_rails} EFA devices")
    return list(dict.fromkeys(problems))


def check_engine_logs(topo: Topology, logs: Mapping[str, str]) -> None:
    """Raise LaunchError when any engine's NIXL log (engine name -> log text) shows a bad EFA transport.

    Does nothing unless `efa.required` is true.
    """
    if not topo.efa.required:
        return
    found = {name: nixl_problems(text, topo.efa.devices) for name, text in logs.items()}
    bad = {name: p for name, p in found.items() if p}
    if bad:
        lines = "\n".join(f"  {name}: {'; '.join(p)}" for name, p in bad.items())
        raise LaunchError(
            f"KV transfer is not on EFA:\n{lines}",
            hint="run `pdctl doctor` for the nodes' EFA state; set efa.required: false to accept TCP",
        )


def engine_nixl_lines(transport: Transport, log_path: str) -> str:
    """The NIXL lines the check reads, from the engine's latest start on (a DEBUG log is too long to copy)."""
    needles = [START_MARK, RAIL_NEEDLE, *(needle for needle, _ in _FAILURES)]
    pattern = " ".join(f"-e {shlex.quote(n)}" for n in needles)
    text = transport.run(f"grep -a -F {pattern} {expand_home(log_path)} 2>/dev/null | tail -n 2000").stdout
    return text.rpartition(START_MARK)[2]


def check_launched(topo: Topology, engines: Sequence[ProcessSpec], hosts: Mapping[str, Transport]) -> None:
    """After the engines are healthy: read each one's NIXL lines on its host and `check_engine_logs` them."""
    if not topo.efa.required:
        return
    specs = [s for s in engines if s.role != "router"]

    def read(node: str) -> dict[str, str]:
        return {s.name: engine_nixl_lines(hosts[node], s.log_path) for s in specs if s.node == node}

    per_node = parallel(sorted({s.node for s in specs}), read)
    check_engine_logs(topo, {name: text for logs in per_node.values() for name, text in logs.items()})
