"""GPU memory before `up` and after `down`: on a shared GPU the deployment's processes are not the only tenants, so
`down` proves the GPUs it used hold no more than they held before `up` started anything."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from rich.console import Console

from pdctl.errors import LaunchError
from pdctl.facts.base import layout_for, layouts_from_env, read
from pdctl.facts.gpu import GpuMemory, GpuMemoryUse
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.topology import Topology

SLACK_MIB = 1024
"""More than this above the reading before `up` is memory the deployment left behind."""
WAIT_S = 30.0
"""The driver frees an exited process's memory with a delay."""


def _read(transport: Transport, node: str) -> list[GpuMemoryUse]:
    return read(transport, GpuMemory(), layout_for(layouts_from_env(), node))


def used(topo: Topology, specs: Sequence[ProcessSpec], hosts: Mapping[str, Transport]) -> dict[str, dict[str, int]]:
    """MiB in use now on every GPU the deployment's engines are given, by node and GPU id."""
    wanted: dict[str, set[int]] = {}
    for spec in specs:
        if spec.role in ("prefill", "decode") and spec.gpus:
            wanted.setdefault(spec.node, set()).update(spec.gpus)
    readings = parallel(sorted(wanted), lambda node: _read(hosts[node], node))
    return {node: {str(m.index): m.used_mib for m in found if m.index in wanted[node]}
            for node, found in readings.items()}


def check_back(
    topo: Topology, hosts: Mapping[str, Transport], before: Mapping[str, Mapping[str, int]], console: Console
) -> None:
    """Wait until every GPU `up` read holds at most what it held then (+ SLACK_MIB); LaunchError if one does not."""
    nodes = sorted(n for n in before if n in hosts)
    deadline = time.monotonic() + WAIT_S
    while True:
        now = parallel(nodes, lambda node: {str(m.index): m.used_mib for m in _read(hosts[node], node)})
        over = [(node, gpu, now[node][gpu], mib) for node in nodes for gpu, mib in sorted(before[node].items())
                if gpu in now[node] and now[node][gpu] > mib + SLACK_MIB]
        if not over or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if over:
        lines = "\n  ".join(f"{node}: GPU {gpu} holds {mib} MiB, {before_mib} MiB before `up`"
                            for node, gpu, mib, before_mib in over)
        raise LaunchError(
            f"{topo.name}: GPU memory is not back to what it was before `up`:\n  {lines}",
            hint="look at `nvidia-smi` on the node for the process that holds it",
        )
    for node in nodes:
        shown = ", ".join(f"GPU {gpu} {now[node].get(gpu, '?')} MiB (before up: {mib})"
                          for gpu, mib in sorted(before[node].items()))
        console.print(f"{node}: GPU memory back: {shown}", highlight=False)
