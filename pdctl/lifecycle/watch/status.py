"""`status` as data: per process (alive, health, uptime, engine metrics, GPU memory) and the router's reuse.

Rendering lives in `status_view`; `--json` is `StatusReport.to_json()` of the same objects.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from pdctl import engine_metrics as em
from pdctl.errors import PdctlError
from pdctl.facts.base import layout_for, layouts_from_env, read
from pdctl.facts.gpu import GpuProcesses
from pdctl.lifecycle.hosts import launch
from pdctl.lifecycle.hosts.connect import reachable
from pdctl.lifecycle.hosts.slurm_job import SlurmStatus, job_status
from pdctl.plan import ProcessSpec, entry, plan
from pdctl.remote.base import Transport
from pdctl.remote.fanout import parallel
from pdctl.remote.here import listens_here
from pdctl.remote.local import LocalTransport
from pdctl.remote.procs import HostProcess
from pdctl.remote.sshconnect import SshOptions
from pdctl.router.wire import RetentionStats, RouterStats
from pdctl.slurm.transport import SlurmTransport
from pdctl.state import StateStore
from pdctl.topology import Topology

# Prometheus sample name -> EngineMetrics field (a counter may come without its _total suffix)
_SAMPLES = {
    em.RUNNING: "running",
    em.WAITING: "waiting",
    em.KV_CACHE_USAGE: "kv_cache_usage",
    em.NIXL_XFER_COUNT: "nixl_transfers",
    em.NIXL_BYTES: "nixl_bytes",
    em.NIXL_FAILED: "nixl_failures",
    em.NIXL_FAILED.removesuffix("_total"): "nixl_failures",
    em.NIXL_EXPIRED: "kv_expired",
    em.NIXL_EXPIRED.removesuffix("_total"): "kv_expired",
    "pdctl_sim_kv_retained_blocks": "kv_retained_blocks",
    "pdctl_sim_kv_num_gpu_blocks": "kv_blocks",
}
PRESSURE = "pressure"  # the release reason of handles dropped to make room (the router's `pdctl_router_kv_releases`)


@dataclass
class EngineMetrics:
    running: float = 0
    waiting: float = 0
    kv_cache_usage: float = 0
    nixl_transfers: float = 0
    nixl_bytes: float = 0
    nixl_failures: float = 0
    kv_expired: float = 0
    # the simulator's own count of the KV blocks it keeps for a peer, against all it has (vLLM exports neither)
    kv_retained_blocks: float | None = None
    kv_blocks: float | None = None


@dataclass
class DecodePins:
    """One decode as a router's retention sees it: the KV its live handles pin there against the decode's total."""

    url: str
    name: str  # the decode's process name (its URL where the plan has no such decode)
    retained_blocks: int = 0
    retained_tokens: int = 0
    handles: int = 0
    capacity_tokens: int | None = None  # the decode's KV, from its /metrics (None: not known yet)
    retained_share: float | None = None  # retained_tokens / capacity_tokens
    kv_usage: float | None = None  # the decode's own KV use at the router's last poll
    releases_queued: int = 0


@dataclass
class DecodeHeld:
    """One decode's KV held by retained blocks: every router's pins there against the decode's total."""

    name: str
    url: str
    kv_usage: float | None = None  # the decode's own KV use (its /metrics now, else a router's last poll)
    capacity_tokens: int | None = None
    retained_tokens: int = 0  # pinned by every router's live handles
    retained_blocks: int = 0
    retained_share: float | None = None  # retained_tokens / capacity_tokens
    handles: int = 0
    by_router: dict[str, int] = field(default_factory=dict)  # router name -> the tokens its handles pin here
    releases_queued: int = 0
    kept_blocks: float | None = None  # the simulator's own count of blocks it keeps for a peer (vLLM says none)
    kv_blocks: float | None = None


@dataclass
class RetentionStatus:
    """A router's retained KV: its pins per decode, and what it released (under pressure: to make room)."""

    high_kv: float = 0.0
    target_kv: float = 0.0
    handles: int = 0
    release_queue: int = 0
    pressure_events: int = 0  # polls that found a decode under pressure and released something
    released_under_pressure: int = 0  # handles released to make room (sent)
    releases: dict[str, int] = field(default_factory=dict)  # why -> releases sent
    decodes: list[DecodePins] = field(default_factory=list)


@dataclass
class ProcessStatus:
    name: str
    role: str
    node: str
    host: str
    url: str
    pid: int | None
    unit: str | None
    alive: bool
    health: str
    uptime_s: float | None
    log_path: str
    metrics: EngineMetrics | None = None
    gpu_memory_mib: int | None = None
    gpus: list[int] = field(default_factory=list)


@dataclass
class RouterStatus:
    url: str
    requests_total: int = 0
    hit: int = 0
    partial: int = 0
    miss: int = 0
    hit_rate: float = 0.0
    reused_tokens_total: int = 0
    local_turns: int = 0
    live_handles: int = 0
    error: str | None = None
    name: str = "router"
    recent_window_s: float = 0.0  # the same hit rate over the router's last recent_window_s seconds
    recent_eligible_turns: int = 0
    recent_hit_rate: float | None = None  # None: no eligible turn in the window
    retention: RetentionStatus | None = None  # disaggregated routers


@dataclass
class StatusReport:
    name: str
    state_file: str | None
    processes: list[ProcessStatus] = field(default_factory=list)
    router: RouterStatus | None = None
    routers: list[RouterStatus] = field(default_factory=list)  # every router, where several share the clients
    strays: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    reach: str = ""
    slurm: SlurmStatus | None = None
    retained: list[DecodeHeld] = field(default_factory=list)  # each decode's retained KV, every router's pins

    @property
    def healthy(self) -> bool:
        ok = all(p.alive and p.health == "ok" for p in self.processes)
        return bool(self.processes) and ok and not self.unreachable

    @property
    def not_running(self) -> bool:
        """Nothing of the deployment found anywhere (after `down`, before `up`): one line, not a table of rows."""
        return (self.state_file is None and self.slurm is None and not self.unreachable and not self.strays
                and all(not p.alive for p in self.processes))

    def shared_gpus(self) -> dict[tuple[str, int], list[ProcessStatus]]:
        """(node, GPU id) -> the processes on it, for GPUs more than one process is given."""
        on: dict[tuple[str, int], list[ProcessStatus]] = {}
        for p in self.processes:
            for gpu in p.gpus:
                on.setdefault((p.node, gpu), []).append(p)
        return {key: procs for key, procs in on.items() if len(procs) > 1}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "healthy": self.healthy}


def status(topo: Topology, *, ssh: SshOptions | None = None) -> StatusReport:
    """Everything `pdctl status` shows, read from the hosts, the engines and the router right now."""
    store = StateStore(topo.name)
    state = store.load()
    records = state.processes if state else {}
    report = StatusReport(topo.name, str(store.path) if state else None)
    if topo.slurm is not None:
        bound, report.slurm = job_status(topo, store)
        if bound is None:  # no running job: nothing of the deployment can run, and there is no host to ask
            report.processes = [_without_job(s, report.slurm) for s in plan(topo)]
            return report
        topo = bound
    specs = plan(topo)
    routers = [s for s in specs if s.role == "router"]
    router = routers[0] if routers else None
    with reachable(topo.nodes, ssh) as (hosts, failed):
        report.unreachable = {n: e.message.splitlines()[0] for n, e in failed.items()}
        nodes = sorted({s.node for s in specs if s.node in hosts})
        live = parallel(nodes, lambda n: _running(hosts[n], topo.name, n, report.unreachable))
        up = [n for n in nodes if n not in report.unreachable]
        gpu = parallel(up, lambda n: _gpu_memory(hosts[n], n, live[n])) if topo.engine == "vllm" else {}
        by_name = {s.name: s for s in specs}
        rows = parallel(list(by_name), lambda n: _process(by_name[n], hosts, live, records, gpu, report.unreachable))
        report.processes = [rows[s.name] for s in specs]
        for node, procs in live.items():
            report.strays += [f"{node}: {name}" for name in procs if name not in by_name]
        if router is None:
            report.router = None  # one aggregated engine: clients talk to the engine itself
        elif router.node in report.unreachable:
            report.router = RouterStatus(router.url, error=f"{router.node} unreachable")
        elif not rows[router.name].alive:
            report.router = RouterStatus(router.url, error="the router is not running")
        else:
            report.router = router_stats(hosts[router.node], router.url, router.name, specs)
        if len(routers) > 1:  # behind a load balancer: each router's own /stats, one row each
            report.routers = [RouterStatus(r.url, error=f"{r.node} unreachable", name=r.name)
                              if r.node in report.unreachable else router_stats(hosts[r.node], r.url, r.name, specs)
                              for r in routers]
        report.retained = retained(report)
        entry_spec = entry(specs)
        report.reach = reach_hint(topo, entry_spec, hosts.get(entry_spec.node))
    return report


def retained(report: StatusReport) -> list[DecodeHeld]:
    """Each decode's retained KV across the routers that report it (one router: its own pins)."""
    routers = [r for r in report.routers or ([report.router] if report.router else []) if r.retention is not None]
    if not routers:
        return []
    engines = {p.url: p for p in report.processes if p.role == "decode"}
    out: dict[str, DecodeHeld] = {}
    for r in routers:
        assert r.retention is not None
        for d in r.retention.decodes:
            held = out.setdefault(d.url, DecodeHeld(d.name, d.url, d.kv_usage, d.capacity_tokens))
            held.capacity_tokens = held.capacity_tokens or d.capacity_tokens
            held.kv_usage = held.kv_usage if held.kv_usage is not None else d.kv_usage
            held.retained_tokens += d.retained_tokens
            held.retained_blocks += d.retained_blocks
            held.handles += d.handles
            held.releases_queued += d.releases_queued
            held.by_router[r.name] = held.by_router.get(r.name, 0) + d.retained_tokens
    for held in out.values():
        m = engines[held.url].metrics if held.url in engines else None
        if m is not None:
            held.kv_usage = m.kv_cache_usage
            held.kept_blocks, held.kv_blocks = m.kv_retained_blocks, m.kv_blocks
        if held.capacity_tokens:
            held.retained_share = round(held.retained_tokens / held.capacity_tokens, 4)
    return list(out.values())


def reach_hint(topo: Topology, router: ProcessSpec, transport: Transport | None) -> str:
    """How a person at the CLI's machine reaches the router."""
    if transport is None or isinstance(transport, LocalTransport | SlurmTransport):
        return f"router: {router.url}"
    if listens_here(transport, urlsplit(router.url).hostname or ""):
        return f"router: {router.url} on {router.node}, which is this machine: open {router.url} directly"
    return (f"router: {router.url} on {router.node}, reached over SSH; from here: "
            f"`pdctl port-forward -t {topo.file} --port {topo.router.port}`, then http://127.0.0.1:{topo.router.port}")


def _without_job(spec: ProcessSpec, job: SlurmStatus) -> ProcessStatus:
    why = f"job {job.jobid} {job.state}" if job.jobid is not None else "no job"
    return ProcessStatus(name=spec.name, role=spec.role, node=spec.node, host="-", url="-", pid=None, unit=None,
                         alive=False, health=why, uptime_s=None, log_path=spec.log_path, gpus=list(spec.gpus))


def _running(transport: Transport, deployment: str, node: str,
             unreachable: dict[str, str]) -> dict[str, list[HostProcess]]:
    try:
        return launch.running(transport, deployment, node)
    except PdctlError as exc:  # the connection dropped after it was opened
        unreachable[node] = exc.message.splitlines()[0]
        return {}


def _process(
    spec: ProcessSpec,
    hosts: Mapping[str, Transport],
    live_by_node: Mapping[str, Mapping[str, list[HostProcess]]],
    records: Mapping[str, Any],
    gpu: Mapping[str, dict[str, int]],
    unreachable: Mapping[str, str],
) -> ProcessStatus:
    record = records.get(spec.name)
    if spec.node in unreachable:
        return ProcessStatus(
            name=spec.name, role=spec.role, node=spec.node, host=spec.host, url=spec.url, pid=None,
            unit=record.unit if record else None, alive=False, health="unreachable", uptime_s=None,
            log_path=spec.log_path,
        )
    transport = hosts[spec.node]
    lead = launch.leader(live_by_node.get(spec.node, {}).get(spec.name, []), record)
    alive = lead is not None
    verdict = launch.health(transport, spec.health_url, timeout=2.0) if alive else "down"
    uptime = time.time() - record.started_at if record is not None and alive else None
    ok = alive and spec.role in ("prefill", "decode") and verdict == "ok"
    metrics = engine_metrics(transport, spec.url) if ok else None
    return ProcessStatus(
        name=spec.name, role=spec.role, node=spec.node, host=spec.host, url=spec.url,
        pid=lead.pid if lead else None, unit=record.unit if record else None, alive=alive, health=verdict,
        uptime_s=uptime, log_path=spec.log_path, metrics=metrics,
        gpu_memory_mib=gpu.get(spec.node, {}).get(spec.name), gpus=list(spec.gpus),
    )


def engine_metrics(transport: Transport, url: str) -> EngineMetrics | None:
    try:
        with httpx.Client(transport=transport.http(), timeout=3.0) as client:
            text = client.get(f"{url}/metrics").text
    except httpx.HTTPError:
        return None
    return parse_metrics(text)


def parse_metrics(text: str) -> EngineMetrics:
    """Sum every sample of the metrics pdctl shows (vLLM labels them per engine and model)."""
    values: dict[str, float] = {}
    for sample, value in em.parse_prometheus(text).items():
        name = _SAMPLES.get(sample)
        if name is not None:
            values[name] = values.get(name, 0.0) + value
    return EngineMetrics(**values)


def router_stats(transport: Transport, url: str, name: str = "router",
                 specs: Sequence[ProcessSpec] = ()) -> RouterStatus:
    try:
        with httpx.Client(transport=transport.http(), timeout=3.0) as client:
            data = client.get(f"{url}/stats").json()
    except (httpx.HTTPError, ValueError) as exc:
        return RouterStatus(url, error=type(exc).__name__, name=name)
    try:
        stats = RouterStats.from_json(data)
    except ValueError as exc:
        return RouterStatus(url, error=str(exc), name=name)
    return RouterStatus(
        url=url, requests_total=stats.requests_total, hit=stats.hit, partial=stats.partial, miss=stats.miss,
        hit_rate=stats.hit_rate, reused_tokens_total=stats.reused_tokens_total, local_turns=stats.local_turns,
        live_handles=stats.live_handles, name=name, recent_window_s=stats.recent_window_s,
        recent_eligible_turns=stats.recent_eligible_turns,
        recent_hit_rate=stats.recent_hit_rate if stats.recent_eligible_turns else None,
        retention=retention_status(stats.retention, specs) if stats.retention is not None else None,
    )


def retention_status(r: RetentionStats, specs: Sequence[ProcessSpec] = ()) -> RetentionStatus:
    """The /stats `retention` section as `status` shows it: each decode by its process name."""
    names = {s.url: s.name for s in specs if s.role == "decode"}
    sent = {reason: results.get("sent", 0) for reason, results in r.releases.items()}
    return RetentionStatus(
        high_kv=r.high_kv, target_kv=r.target_kv, handles=r.handles, release_queue=r.release_queue,
        pressure_events=r.pressure_events, released_under_pressure=sent.get(PRESSURE, 0),
        releases={k: v for k, v in sorted(sent.items()) if v},
        decodes=[DecodePins(
            d.url, names.get(d.url, d.url), d.retained_blocks, d.retained_tokens, d.handles, d.capacity_tokens,
            round(d.retained_tokens / d.capacity_tokens, 4) if d.capacity_tokens else None, d.kv_usage,
            d.releases_queued)
            for d in r.decodes],
    )


def _gpu_memory(transport: Transport, node: str, live: Mapping[str, list[HostProcess]]) -> dict[str, int]:
    """MiB of GPU memory per process name, summing its children (vLLM's engine cores hold the memory)."""
    owner = {p.pid: name for name, procs in live.items() for p in procs}
    used: dict[str, int] = {}
    for proc in read(transport, GpuProcesses(), layout_for(layouts_from_env(), node)):
        if proc.pid in owner and proc.used_mib is not None:
            name = owner[proc.pid]
            used[name] = used.get(name, 0) + proc.used_mib
    return used
