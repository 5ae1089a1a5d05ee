"""What the router counts: Prometheus series for /metrics, plain numbers for /stats (`pdctl status`, `bench`)."""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from pdctl import __version__
from pdctl.router.kv.release import ReleaseMetrics
from pdctl.router.lean_metrics import Counter, Histogram
from pdctl.router.upstream.admission import Gate
from pdctl.router.upstream.pools import Pool
from pdctl.router.wire import (
    D_TO_P,
    KV_SOURCES,
    P_TO_D,
    REUSE_PAIRS,
    WHOLE_PREFILL,
    KvChoiceStats,
    RetentionStats,
    RouterStats,
    UpstreamStats,
    kv_source,
)

_MS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKEN_BUCKETS = (0, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
_ROLES = ("prefill", "decode")
RECENT_S = 60.0  # the window of /stats recent_hit_rate


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("pdctl_router_requests", "Requests by route and status.", ["route", "status"],
                                registry=r)
        self.reuse = Counter("pdctl_router_kv_reuse", "KV reuse outcomes by reason.", ["outcome", "reason"],
                             registry=r)
        self.reused_tokens = Counter("pdctl_router_reused_tokens",
                                     "Prompt tokens not recomputed: read by the prefill from a decode, or found "
                                     "in the decode's own cache on a local turn.", registry=r)
        self.local_turns = Counter("pdctl_router_local_turns", "Turns the decode ran alone (conditional "
                                   "disaggregation), without the prefill hop.", registry=r)
        self.whole_prefill_turns = Counter("pdctl_router_whole_prefill_turns", "Turns served whole on a prefill "
                                           "(router.overflow_kv: their decode was short of KV).", registry=r)
        self.prefill_seconds = Histogram("pdctl_router_prefill_duration_seconds", "Prefill hop wall time.",
                                         buckets=_MS_BUCKETS, registry=r)
        self.ttft_seconds = Histogram("pdctl_router_ttft_seconds", "Router-observed time to first streamed byte.",
                                      buckets=_MS_BUCKETS, registry=r)
        self.upstream_errors = Counter("pdctl_router_upstream_errors", "Failed upstream calls.", ["role", "kind"],
                                       registry=r)
        self.live_handles = Gauge("pdctl_router_live_handles", "Decode handles the router holds.", registry=r)
        self.healthy = Gauge("pdctl_router_upstream_healthy", "1 if the upstream is in its pool.", ["role", "index"],
                             registry=r)
        self.pinned = Gauge("pdctl_router_pinned_tokens", "Decode KV tokens the router's live handles pin (whole "
                            "blocks).", ["index"], registry=r)
        self.kv_source = Counter("pdctl_router_turn_kv_source", "Turns by where their prompt KV came from: "
                                 "decode_read (D->P), decode_cache (a local turn), prefill_cache (the "
                                 "prefill's own cache, nothing read; also a warm turn's miss it partly "
                                 "served), prefill_whole (overflow_kv), recomputed (a miss the prefill "
                                 "computed).", ["source"], registry=r)
        self.kv_moved = Histogram("pdctl_router_kv_moved_tokens", "KV tokens one turn moved between engines: d_to_p "
                                  "(the tokens the prefill read from the decode; 0 when its own cache held "
                                  "them), p_to_d (the prompt KV the "
                                  "prefill offered the decode; its prefix cache may hold part).", ["direction"],
                                  buckets=_TOKEN_BUCKETS, registry=r)
        self.diverged = Histogram("pdctl_router_prefix_diverged_tokens", "Where a diverged prefix first differed: "
                                  "the first token of the first differing block.", buckets=_TOKEN_BUCKETS,
                                  registry=r)
        self.refused = Counter("pdctl_router_admission_refused", "Requests refused a slot: 429 (queue full) or 503 "
                               "(queued past --queue-timeout).", ["role", "status"], registry=r)
        self.inflight = Gauge("pdctl_router_admission_inflight", "Requests holding a slot of the pool.", ["role"],
                              registry=r)
        self.queued = Gauge("pdctl_router_admission_queued", "Requests waiting for a slot of the pool.", ["role"],
                            registry=r)
        self.capacity = Gauge("pdctl_router_admission_capacity", "Slots of the pool (per instance x healthy).",
                              ["role"], registry=r)
        self.outstanding = Gauge("pdctl_router_upstream_outstanding", "Requests in flight to the upstream.",
                                 ["role", "index"], registry=r)
        self.work = Gauge("pdctl_router_upstream_work_tokens", "Prompt tokens in flight to the upstream not yet "
                          "computed (placement's estimate).", ["role", "index"], registry=r)
        self.upstream_info = Gauge("pdctl_router_upstream_info", "1 per upstream: its URL by role and index.",
                                   ["role", "index", "url"], registry=r)
        self.budget = Gauge("pdctl_router_pin_budget_tokens", "The pin budget of the decode (tokens; absent: none).",
                            ["index"], registry=r)
        self.traces = Counter("pdctl_router_trace_spans", "Spans of the turns' traces by result: exported, failed "
                              "(the collector refused or was unreachable), dropped (the export queue was full).",
                              ["result"], registry=r)
        # Label children looked up once: a turn counts into them without the labels' dict lookups.
        self._sources = {source: self.kv_source.labels(source) for source in KV_SOURCES}
        self._d_to_p, self._p_to_d = self.kv_moved.labels(D_TO_P), self.kv_moved.labels(P_TO_D)
        # Every known label value at 0 from the start: a rate over a series needs the 0 before the first count, and
        # a dashboard's hit rate needs its hit series while there have been only misses (after a restart too).
        for role in _ROLES:
            for status in ("429", "503"):
                self.refused.labels(role, status)
        for outcome, reason in REUSE_PAIRS:
            self.reuse.labels(outcome, reason)
        self.releases = ReleaseMetrics(r)
        self._requests: dict[tuple[str, int], Any] = {}
        self._reuse: dict[tuple[str, str], Any] = {}
        self.started = time.monotonic()
        self.requests_total = 0
        self.outcomes: Tally[str] = Tally({"hit": 0, "partial": 0, "miss": 0})
        self.reasons: Tally[str] = Tally()
        self.reused_tokens_total = 0
        self.local_turns_total = 0
        self.whole_prefill_total = 0
        self.eligible = 0
        # Eligible turns of the last RECENT_S seconds, (when, reused), for the recent hit rate: after a change of
        # settings (bidirectional on/off, a reset) the rate since start mixes both.
        self.recent: deque[tuple[float, bool]] = deque()

    def request(self, route: str, status: int) -> None:
        self.requests_total += 1
        child = self._requests.get((route, status))
        if child is None:  # label children looked up once per (route, status): the lookup costs more than inc()
            if len(self._requests) >= 4096:
                self._requests.clear()
            child = self._requests[(route, status)] = self.requests.labels(route, str(status))
        child.inc()

    def reuse_outcome(self, outcome: str, reason: str, tokens: int, eligible: bool, read: int | None = None,
                      cached: int | None = None) -> None:
        self.outcomes[outcome] += 1
        self.reasons[reason] += 1
        self.reused_tokens_total += tokens
        if eligible or outcome != "miss":
            self.eligible += 1
            now = time.monotonic()
            self.recent.append((now, outcome != "miss"))
            self._forget(now)
        child = self._reuse.get((outcome, reason))
        if child is None:
            child = self._reuse[(outcome, reason)] = self.reuse.labels(outcome, reason)
        child.inc()
        self._sources[kv_source(outcome, reason, read, cached)].inc()
        if tokens:
            self.reused_tokens.inc(tokens)

    def _forget(self, now: float) -> None:
        """Drop the recent window's turns older than RECENT_S (on every turn: memory bounded without /stats)."""
        while self.recent and self.recent[0][0] < now - RECENT_S:
            self.recent.popleft()

    def moved(self, d_to_p: int, p_to_d: int | None) -> None:
        """A turn through the prefill: the tokens the prefill read from the decode, and those it offered back."""
        self._d_to_p.observe(d_to_p)
        if p_to_d is not None:
            self._p_to_d.observe(p_to_d)

    def diverged_at(self, tokens: int) -> None:
        self.diverged.observe(tokens)

    def traced(self, result: str, spans: int) -> None:
        self.traces.labels(result).inc(spans)

    def refusal(self, role: str, status: int) -> None:
        self.refused.labels(role, str(status)).inc()

    def local_turn(self) -> None:
        self.local_turns_total += 1
        self.local_turns.inc()

    def whole_prefill_turn(self, outcome: str, eligible: bool) -> None:
        self.reuse_outcome(outcome, WHOLE_PREFILL, 0, eligible)
        self.whole_prefill_total += 1
        self.whole_prefill_turns.inc()

    def error(self, role: str, kind: str) -> None:
        self.upstream_errors.labels(role, kind).inc()

    def stats(self, live_handles: int, prefill: Pool, decode: Pool, pinned: dict[str, int] | None = None,
              budgets: dict[str, int] | None = None, kv_use: dict[str, float] | None = None,
              held: dict[str, int] | None = None, retention: RetentionStats | None = None,
              kv_choice: KvChoiceStats | None = None) -> dict[str, object]:
        """The /stats document (pdctl.router.wire.RouterStats: its readers parse the same type)."""
        reused = self.outcomes["hit"] + self.outcomes["partial"]
        self._forget(time.monotonic())
        recent_reused = sum(1 for _, r in self.recent if r)
        return RouterStats(
            requests_total=self.requests_total,
            reuse=dict(self.outcomes),
            reuse_reasons=dict(self.reasons),
            reused_tokens_total=self.reused_tokens_total,
            local_turns=self.local_turns_total,
            whole_prefill_turns=self.whole_prefill_total,
            hit_rate=round(reused / self.eligible, 4) if self.eligible else 0.0,
            eligible_turns=self.eligible,
            reused_turns=reused,
            recent_window_s=RECENT_S,
            recent_eligible_turns=len(self.recent),
            recent_reused_turns=recent_reused,
            recent_hit_rate=round(recent_reused / len(self.recent), 4) if self.recent else 0.0,
            live_handles=live_handles,
            pinned_tokens=pinned or {},
            pin_budget_tokens=budgets or {},
            releases=dict(self.releases.sent),
            releases_failed=self.releases.failed,
            kv_use=kv_use or {},
            prefill=_upstreams(prefill),
            decode=_upstreams(decode, held or {}),
            uptime_s=round(time.monotonic() - self.started, 3),
            version=__version__,
            retention=retention,
            kv_choice=kv_choice,
        ).to_json()

    def exposition(self, live_handles: int, prefill: Pool, decode: Pool, pinned: dict[str, int] | None = None,
                   budgets: dict[str, int] | None = None, gates: Iterable[Gate] = ()) -> bytes:
        self.live_handles.set(live_handles)
        for pool in (prefill, decode):
            for i, u in enumerate(pool.members):
                index = str(i)
                self.healthy.labels(pool.role, index).set(1 if u.healthy else 0)
                self.outstanding.labels(pool.role, index).set(u.outstanding)
                self.work.labels(pool.role, index).set(u.work)
                self.upstream_info.labels(pool.role, index, u.url).set(1)
        for i, u in enumerate(decode.members):
            self.pinned.labels(str(i)).set((pinned or {}).get(u.url, 0))
            if budgets and u.url in budgets:
                self.budget.labels(str(i)).set(budgets[u.url])
        for gate in gates:
            role = gate.pool.role
            self.inflight.labels(role).set(gate.inflight)
            self.queued.labels(role).set(gate.queued)
            self.capacity.labels(role).set(gate.capacity())
        return generate_latest(self.registry)


def _upstreams(pool: Pool, held: dict[str, int] | None = None) -> tuple[UpstreamStats, ...]:
    return tuple(UpstreamStats(u.url, u.healthy, u.outstanding, u.failures, u.generation, u.work, u.draining,
                               (held or {}).get(u.url, 0)) for u in pool.members)
