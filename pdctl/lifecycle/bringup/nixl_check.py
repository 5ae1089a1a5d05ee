"""After launch on EFA topologies: read the engines' NIXL log lines and say what is wrong with the transport.

NIXL logs through absl to stderr (reference efa-provisioning.md 2.5); pdctl sets NIXL_LOG_LEVEL so the rail
lines are there. A healthy p5en engine says `Created 16 rails using provider=efa` (NIXL >= 1.0) or
`Successfully created 16 data rails and ... control rails using provider=efa` (0.8-0.10).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from pdctl import engine_metrics as em
from pdctl.errors import LaunchError
from pdctl.plan import ProcessSpec
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.shell import expand_home
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

    Does nothing unless `efa.required` is true, nor in `mode: aggregated`, whose engines run no KV connector.
    """
    if not topo.efa.required or topo.mode == "aggregated":
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
    if not topo.efa.required or topo.mode == "aggregated":
        return
    specs = [s for s in engines if s.role != "router"]

    def read(node: str) -> dict[str, str]:
        return {s.name: engine_nixl_lines(hosts[node], s.log_path) for s in specs if s.node == node}

    per_node = parallel(sorted({s.node for s in specs}), read)
    check_engine_logs(topo, {name: text for logs in per_node.values() for name, text in logs.items()})


SHARED_GPU_MIN_GBPS = 2.0
"""Below this, instances sharing a GPU move KV on UCX's TCP fallback (0.41-0.49 GB/s measured on one H200), not
CUDA IPC (58 GB/s and more): docs/results/h200-1gpu/nixl-same-gpu."""


def kv_rate_gbps(log_text: str) -> float | None:
    """GB/s of every `KV Transfer metrics` line in one engine's log (bytes over transfer time); None without any."""
    kv = em.kv_log_samples(line for line in log_text.splitlines() if em.KV_LOG_NEEDLE in line)
    transfers, seconds = kv.get(em.NIXL_XFER_COUNT, 0.0), kv.get(em.NIXL_XFER_SECONDS, 0.0)
    return kv.get(em.NIXL_BYTES, 0.0) / seconds / 1e9 if transfers and seconds > 0 else None


def shared_gpu_problem(topo: Topology, logs: Mapping[str, str]) -> tuple[float | None, str | None]:
    """The best KV rate the engines logged (engine name -> log text) and, when it is the slow path's, why that fails."""
    rates = [r for r in (kv_rate_gbps(text) for text in logs.values()) if r is not None]
    if not rates:
        return None, None
    best = max(rates)
    if best >= SHARED_GPU_MIN_GBPS:
        return best, None
    shared = "; ".join(f"GPU {gpu} of `{node}`: {', '.join(names)}" for (node, gpu), names in
                       sorted(topo.shared_gpus().items()))
    return best, (
        f"KV moves at {best:.2f} GB/s between instances sharing a GPU ({shared}): UCX's TCP fallback, not CUDA IPC "
        f"(below {SHARED_GPU_MIN_GBPS:g} GB/s)"
    )


def check_shared_gpu_rate(
    topo: Topology, engines: Sequence[ProcessSpec], hosts: Mapping[str, Transport], wait_s: float = 15.0
) -> float | None:
    """After the smoke test of a deployment whose instances share a GPU over UCX: LaunchError when its KV transfers
    ran at the slow path's rate. vLLM logs `KV Transfer metrics` every few seconds after a transfer, so this waits
    up to `wait_s` for a line; returns the rate seen (None: no transfer logged, nothing to judge)."""
    if topo.engine != "vllm" or topo.connector.backend != "UCX" or not topo.shared_gpus() or topo.mode == "aggregated":
        return None
    import time

    specs = [s for s in engines if s.role != "router"]
    pattern = f"-e {shlex.quote(START_MARK)} -e {shlex.quote(em.KV_LOG_NEEDLE)}"
    deadline = time.monotonic() + wait_s
    while True:
        logs = {s.name: hosts[s.node].run(
            f"grep -a -F {pattern} {expand_home(s.log_path)} 2>/dev/null | tail -n 500").stdout.rpartition(
            START_MARK)[2] for s in specs}
        rate, problem = shared_gpu_problem(topo, logs)
        if problem:
            raise LaunchError(problem, hint="pdctl sets UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y for shared GPUs: keep it and "
                              "cuda_ipc in UCX_TLS (env), or run the baseline instead: mode: aggregated")
        if rate is not None or time.monotonic() > deadline:
            return rate
        time.sleep(1.0)
