"""After launch on EFA topologies: read the engines' NIXL log lines and say what is wrong with the transport.

NIXL logs through absl to stderr (reference efa-provisioning.md 2.5); pdctl sets NIXL_LOG_LEVEL so the rail
lines are there. A healthy p5en engine says `Created 16 rails using provider=efa` (NIXL >= 1.0) or
`Successfully created 16 data rails and ... control rails using provider=efa` (0.8-0.10).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pdctl.errors import LaunchError
from pdctl.topology import Topology

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
