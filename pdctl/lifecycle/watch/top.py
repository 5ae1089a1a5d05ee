"""`pdctl top`: the dashboard's figures (lifecycle/watch/dashboard.py) live in a terminal, without Prometheus.

Each sample reads every router's and engine's /metrics through the node's transport (SSH or local, as `status`
does), with the keys they require; a view is the difference between two samples: rates and percentiles over the
interval, as Prometheus's `rate` and `histogram_quantile` compute them, and the gauges as they are now.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from pdctl.lifecycle.bringup.smoke import router_api_key
from pdctl.lifecycle.hosts.connect import reachable
from pdctl.lifecycle.hosts.engine_key import read_key
from pdctl.lifecycle.watch.samples import Samples, by_labels, delta, merge, parse, quantiles, sum_of
from pdctl.plan import ProcessSpec, plan
from pdctl.remote.base import Transport
from pdctl.remote.sshconnect import SshOptions
from pdctl.topology import Topology


@dataclass
class Instance:
    process: str
    component: str
    up: bool
    running: float = 0.0
    waiting: float = 0.0
    kv_use: float = 0.0
    router_outstanding: float = 0.0
    router_healthy: bool | None = None


@dataclass
class Retained:
    """One decode's KV held by retained blocks: every router's pins against its total, and by router."""

    process: str
    kv_use: float | None = None  # the decode's own KV use (1 = full)
    capacity_blocks: float | None = None  # its KV blocks in all
    retained_blocks: float = 0.0  # pinned by every router's live handles
    retained_share: float | None = None  # retained_blocks / capacity_blocks
    handles: float = 0.0
    by_router: dict[str, float] = field(default_factory=dict)  # router process -> the blocks its handles pin here
    kept_blocks: float | None = None  # the simulator's own count of blocks it keeps for a peer (vLLM says none)


@dataclass
class TopView:
    deployment: str
    interval_s: float
    turns_per_s: float = 0.0
    hit_rate: float | None = None
    ttft_s: dict[str, float | None] = field(default_factory=dict)  # router-observed p50/p90/p99
    engine_ttft_s: dict[str, float | None] = field(default_factory=dict)
    itl_s: dict[str, float | None] = field(default_factory=dict)
    outcomes: dict[str, float] = field(default_factory=dict)  # turns in the interval
    reasons: dict[str, float] = field(default_factory=dict)  # "outcome: reason" -> turns in the interval
    diverged_at_tokens: float | None = None  # median first differing token of prefix_diverged turns
    kv_source: dict[str, float] = field(default_factory=dict)
    moved_tokens_per_turn: dict[str, float] = field(default_factory=dict)
    nixl_bytes_per_turn: dict[str, float] = field(default_factory=dict)
    pinned: dict[str, tuple[float, float | None]] = field(default_factory=dict)  # decode index -> (pinned, budget)
    admission: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # role -> in flight, queued, slots
    refusals: dict[str, float] = field(default_factory=dict)  # "role status" -> in the interval
    instances: list[Instance] = field(default_factory=list)
    retained: list[Retained] = field(default_factory=list)
    release_queue: dict[str, float] = field(default_factory=dict)  # router -> releases submitted, not yet done
    releases: dict[str, float] = field(default_factory=dict)  # why -> releases sent in the interval
    releases_total: dict[str, float] = field(default_factory=dict)  # why -> since the routers started
    # The warm turns' KV source as the router's cost model chose it (decode_cache, decode_read, recomputed)
    kv_choice: dict[str, float] = field(default_factory=dict)  # source -> warm turns in the interval
    kv_choice_share: dict[str, float] = field(default_factory=dict)  # source -> share of them
    kv_choice_total: dict[str, float] = field(default_factory=dict)  # source -> since the routers started
    kv_choice_default: float = 0.0  # of the interval's, chosen by the rule (the model's rates not yet measured)
    kv_choice_probe: float = 0.0  # of the interval's, local turns that measured the decode's costs (ratio 0)
    kv_choice_refused: dict[str, float] = field(default_factory=dict)  # why the decode alone was refused
    kv_choice_ttft_s: dict[str, dict[str, float | None]] = field(default_factory=dict)  # source -> p50 by kind
    kv_choice_error_s: dict[str, float | None] = field(default_factory=dict)  # |measured - predicted| p50/p90

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _in_pool(routers: Iterable[Samples]) -> dict[tuple[str, ...], bool]:
    """(role, index) -> in the pool of every router that reports it: each router's health gauge on its own (a sum
    across routers is 2.0 for an engine both hold healthy)."""
    pool: dict[tuple[str, ...], bool] = {}
    for samples in routers:
        for key, value in by_labels(samples, "pdctl_router_upstream_healthy", "role", "index").items():
            pool[key] = pool.get(key, True) and value == 1.0
    return pool


def view(topo: Topology, specs: list[ProcessSpec], now: dict[str, Samples], before: dict[str, Samples],
         seconds: float) -> TopView:
    """The figures between two samples (process name -> its /metrics; a process missing from `now` is down)."""
    routers = [s for s in specs if s.role == "router"]
    r_now = merge(now.get(s.name, {}) for s in routers)
    r_old = merge(before.get(s.name, {}) for s in routers)
    v = TopView(topo.name, round(seconds, 3))
    reuse = delta(r_now, r_old, "pdctl_router_kv_reuse_total")
    for labels, n in reuse.items():
        d = dict(labels)
        v.outcomes[d["outcome"]] = v.outcomes.get(d["outcome"], 0.0) + n
        if n:
            key = f"{d['outcome']}: {d['reason']}"
            v.reasons[key] = v.reasons.get(key, 0.0) + n
    turns = sum(v.outcomes.values())
    v.turns_per_s = round(turns / seconds, 3) if seconds > 0 else 0.0
    eligible = sum(n for labels, n in reuse.items()
                   if dict(labels)["reason"] not in ("new_conversation", "not_eligible", "n_gt_1"))
    reused = v.outcomes.get("hit", 0.0) + v.outcomes.get("partial", 0.0)
    v.hit_rate = round(reused / eligible, 4) if eligible else None
    v.ttft_s = quantiles(r_now, r_old, "pdctl_router_ttft_seconds")
    v.diverged_at_tokens = quantiles(r_now, r_old, "pdctl_router_prefix_diverged_tokens")["p50"]
    for labels, n in delta(r_now, r_old, "pdctl_router_turn_kv_source_total").items():
        v.kv_source[dict(labels)["source"]] = n
    sums = delta(r_now, r_old, "pdctl_router_kv_moved_tokens_sum")
    counts = delta(r_now, r_old, "pdctl_router_kv_moved_tokens_count")
    for labels, n in counts.items():
        if n:
            v.moved_tokens_per_turn[dict(labels)["direction"]] = round(sums.get(labels, 0.0) / n, 1)
    hops = sum(n for labels, n in counts.items() if dict(labels)["direction"] == "d_to_p")
    for labels, n in delta(r_now, r_old, "pdctl_router_admission_refused_total").items():
        d = dict(labels)
        v.refusals[f"{d['role']} {d['status']}"] = n
    for role in ("prefill", "decode"):
        if any(("role", role) in k for k in r_now.get("pdctl_router_admission_inflight", {})):
            v.admission[role] = (sum_of(r_now, "pdctl_router_admission_inflight", role=role),
                                 sum_of(r_now, "pdctl_router_admission_queued", role=role),
                                 sum_of(r_now, "pdctl_router_admission_capacity", role=role))
    budgets = by_labels(r_now, "pdctl_router_pin_budget_tokens", "index")
    for (index,), n in by_labels(r_now, "pdctl_router_pinned_tokens", "index").items():
        v.pinned[index] = (n, budgets.get((index,)))
    urls: dict[str, tuple[str, ...]] = {}
    for labels in r_now.get("pdctl_router_upstream_info", {}):
        d = dict(labels)
        urls[d.get("url", "")] = (d.get("role", ""), d.get("index", ""))
    outstanding = by_labels(r_now, "pdctl_router_upstream_outstanding", "role", "index")
    healthy = _in_pool(now.get(s.name, {}) for s in routers)
    engines = [s for s in specs if s.role != "router"]
    e_now = {s.name: now.get(s.name, {}) for s in engines}
    e_old = {s.name: before.get(s.name, {}) for s in engines}
    decodes = [s.name for s in engines if s.role == "decode" or s.name.startswith("aggregated-")]
    d_now, d_old = merge(e_now[n] for n in decodes), merge(e_old[n] for n in decodes)
    v.engine_ttft_s = quantiles(d_now, d_old, "vllm:time_to_first_token_seconds")
    v.itl_s = quantiles(d_now, d_old, "vllm:inter_token_latency_seconds")
    for s in engines:
        nbytes = sum(delta(e_now[s.name], e_old[s.name], "vllm:nixl_bytes_transferred_sum").values())
        if hops and nbytes:
            key = "aggregated" if s.name.startswith("aggregated-") else s.role
            v.nixl_bytes_per_turn[key] = v.nixl_bytes_per_turn.get(key, 0.0) + round(nbytes / hops, 1)
    for s in specs:
        m = now.get(s.name)
        inst = Instance(s.name, "aggregated" if s.name.startswith("aggregated-") else s.role, m is not None)
        if m is not None and s.role != "router":
            inst.running = sum_of(m, "vllm:num_requests_running")
            inst.waiting = sum_of(m, "vllm:num_requests_waiting")
            inst.kv_use = max(m.get("vllm:kv_cache_usage_perc", {}).values(), default=0.0)
        upstream = urls.get(s.url)
        if upstream is not None:
            inst.router_outstanding = outstanding.get(upstream, 0.0)
            inst.router_healthy = healthy.get(upstream, False)
        v.instances.append(inst)
    _retention(v, specs, now, r_now, r_old)
    _kv_choice(v, r_now, r_old)
    return v


def _decode_urls(samples: Samples) -> dict[str, str]:
    """A router's decode index -> the decode's URL (its pdctl_router_upstream_info)."""
    return {d.get("index", ""): d.get("url", "") for d in map(dict, samples.get("pdctl_router_upstream_info", {}))
            if d.get("role") == "decode"}


def _capacity_blocks(samples: Samples) -> float | None:
    """An engine's KV blocks from its vllm:cache_config_info (vLLM and the simulator both say), if it says."""
    for labels in samples.get("vllm:cache_config_info", {}):
        blocks = dict(labels).get("num_gpu_blocks", "")
        if blocks.isdigit():
            return float(blocks)
    return None


def _retention(v: TopView, specs: list[ProcessSpec], now: dict[str, Samples], r_now: Samples,
               r_old: Samples) -> None:
    """Each decode's retained KV, every router's pins on it by router; releases and the release queue."""
    by_url = {s.url: s.name for s in specs if s.role == "decode"}
    held: dict[str, Retained] = {}
    for r in (s for s in specs if s.role == "router"):
        samples = now.get(r.name)
        if samples is None or "pdctl_router_retained_blocks" not in samples:
            continue
        v.release_queue[r.name] = sum_of(samples, "pdctl_router_release_queue")
        urls = _decode_urls(samples)
        blocks = by_labels(samples, "pdctl_router_retained_blocks", "index")
        handles = by_labels(samples, "pdctl_router_retained_handles", "index")
        capacity = by_labels(samples, "pdctl_router_decode_kv_capacity_blocks", "index")
        for (index,), n in sorted(blocks.items()):
            name = by_url.get(urls.get(index, ""), f"decode {index}")
            d = held.setdefault(name, Retained(name))
            d.retained_blocks += n
            d.handles += handles.get((index,), 0.0)
            d.by_router[r.name] = d.by_router.get(r.name, 0.0) + n
            if d.capacity_blocks is None and (index,) in capacity:
                d.capacity_blocks = capacity[(index,)]
    for d in held.values():
        m = now.get(d.process)
        if m is not None:
            d.kv_use = max(m.get("vllm:kv_cache_usage_perc", {}).values(), default=0.0)
            d.capacity_blocks = d.capacity_blocks or _capacity_blocks(m)
            if "pdctl_sim_kv_retained_blocks" in m:
                d.kept_blocks = sum_of(m, "pdctl_sim_kv_retained_blocks")
        if d.capacity_blocks:
            d.retained_share = round(d.retained_blocks / d.capacity_blocks, 4)
    v.retained = list(held.values())
    for result in ("sent", "carried"):  # alone, or on a turn's own prefill request
        for (reason,), n in by_labels(r_now, "pdctl_router_kv_releases_total", "reason", result=result).items():
            v.releases_total[reason] = v.releases_total.get(reason, 0.0) + n
            old = sum_of(r_old, "pdctl_router_kv_releases_total", reason=reason, result=result)
            v.releases[reason] = v.releases.get(reason, 0.0) + max(0.0, n - old)


def _kv_choice(v: TopView, r_now: Samples, r_old: Samples) -> None:
    """The warm turns' KV-source mix over the interval and since start, and how well the model predicted TTFT."""
    name = "pdctl_router_kv_choice_total"
    if name not in r_now:
        return
    for (source,), n in by_labels(r_now, name, "source").items():
        v.kv_choice_total[source] = n
        v.kv_choice[source] = max(0.0, n - sum_of(r_old, name, source=source))
    turns = sum(v.kv_choice.values())
    v.kv_choice_share = {k: round(n / turns, 4) for k, n in v.kv_choice.items()} if turns else {}
    v.kv_choice_default = max(0.0, sum_of(r_now, name, basis="default") - sum_of(r_old, name, basis="default"))
    v.kv_choice_probe = max(0.0, sum_of(r_now, name, basis="probe") - sum_of(r_old, name, basis="probe"))
    for labels, n in delta(r_now, r_old, "pdctl_router_kv_choice_local_refused_total").items():
        why = dict(labels)["why"]
        v.kv_choice_refused[why] = v.kv_choice_refused.get(why, 0.0) + n
    for source in v.kv_choice_total:
        v.kv_choice_ttft_s[source] = {
            kind: quantiles(r_now, r_old, "pdctl_router_kv_choice_ttft_seconds", source=source, kind=kind)["p50"]
            for kind in ("predicted", "measured")}
    error = quantiles(r_now, r_old, "pdctl_router_kv_choice_error_seconds")
    v.kv_choice_error_s = {"p50": error["p50"], "p90": error["p90"]}


class Sampler:
    """The deployment's /metrics, read as one sample per call to `sample` (a context manager: the connections)."""

    def __init__(self, topo: Topology, ssh: SshOptions | None = None) -> None:
        self.topo = topo
        self.specs = plan(topo)
        self.ssh = ssh
        self._ctx: Any = None
        self.hosts: dict[str, Transport] = {}
        self.keys: dict[str, str | None] = {}
        self.last: dict[str, Samples] = {}
        self.last_at = 0.0

    def __enter__(self) -> Sampler:
        self._ctx = reachable(self.topo.nodes, self.ssh)
        hosts, _failed = self._ctx.__enter__()
        self.hosts = hosts
        client = router_api_key(self.topo)
        router = next((s for s in self.specs if s.role == "router"), None)
        engine = read_key(hosts[router.node], self.topo, router.node) if router and router.node in hosts else None
        for s in self.specs:
            self.keys[s.name] = client if (s.role == "router" or router is None) else engine
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)

    def _read(self, spec: ProcessSpec) -> Samples | None:
        transport = self.hosts.get(spec.node)
        if transport is None:
            return None
        key = self.keys.get(spec.name)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        try:
            with httpx.Client(transport=transport.http(), timeout=3.0) as client:
                r = client.get(f"{spec.url}/metrics", headers=headers)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            return parse(r.text)
        except ValueError:
            return None

    def sample(self) -> TopView:
        now = {s.name: m for s in self.specs if (m := self._read(s)) is not None}
        at = time.monotonic()
        out = view(self.topo, self.specs, now, self.last, at - self.last_at if self.last_at else 0.0)
        self.last, self.last_at = now, at
        return out
