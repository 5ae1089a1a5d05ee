"""What the router counts: Prometheus series for /metrics, plain numbers for /stats (`pdctl status`, `bench`)."""

from __future__ import annotations

import time
from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pdctl import __version__
from pdctl.router.kv.release import ReleaseMetrics
from pdctl.router.upstream.pools import Pool
from pdctl.router.wire import WHOLE_PREFILL, RouterStats, UpstreamStats

_MS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)



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
        self.releases = ReleaseMetrics(r)
        self.started = time.monotonic()
        self.requests_total = 0
        self.outcomes: Tally[str] = Tally({"hit": 0, "partial": 0, "miss": 0})
        self.reasons: Tally[str] = Tally()
        self.reused_tokens_total = 0
        self.local_turns_total = 0
        self.whole_prefill_total = 0
        self.eligible = 0

    def request(self, route: str, status: int) -> None:
        self.requests_total += 1
        self.requests.labels(route, str(status)).inc()

    def reuse_outcome(self, outcome: str, reason: str, tokens: int, eligible: bool) -> None:
        self.outcomes[outcome] += 1
        self.reasons[reason] += 1
        self.reused_tokens_total += tokens
        self.eligible += eligible or outcome != "miss"
        self.reuse.labels(outcome, reason).inc()
        if tokens:
            self.reused_tokens.inc(tokens)

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
              held: dict[str, int] | None = None) -> dict[str, object]:
        """The /stats document (pdctl.router.wire.RouterStats: its readers parse the same type)."""
        reused = self.outcomes["hit"] + self.outcomes["partial"]
        return RouterStats(
            requests_total=self.requests_total,
            reuse=dict(self.outcomes),
            reuse_reasons=dict(self.reasons),
            reused_tokens_total=self.reused_tokens_total,
            local_turns=self.local_turns_total,
            whole_prefill_turns=self.whole_prefill_total,
            hit_rate=round(reused / self.eligible, 4) if self.eligible else 0.0,
            eligible_turns=self.eligible,
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
        ).to_json()

    def exposition(self, live_handles: int, prefill: Pool, decode: Pool,
                   pinned: dict[str, int] | None = None) -> bytes:
        self.live_handles.set(live_handles)
        for pool in (prefill, decode):
            for i, u in enumerate(pool.members):
                self.healthy.labels(pool.role, str(i)).set(1 if u.healthy else 0)
        for i, u in enumerate(decode.members):
            self.pinned.labels(str(i)).set((pinned or {}).get(u.url, 0))
        return generate_latest(self.registry)


def _upstreams(pool: Pool, held: dict[str, int] | None = None) -> tuple[UpstreamStats, ...]:
    return tuple(UpstreamStats(u.url, u.healthy, u.outstanding, u.failures, u.generation, u.work, u.draining,
                               (held or {}).get(u.url, 0)) for u in pool.members)
