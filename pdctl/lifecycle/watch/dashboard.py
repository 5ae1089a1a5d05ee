"""pdctl's Grafana dashboard: every panel's PromQL, declared once, and the dashboard JSON built from them.

The queries read what `pdctl observe`'s scrape configuration collects (lifecycle/watch/observe.py): the router's
`pdctl_router_*` series and the engines' `vllm:*` series, every target labelled with its `deployment`, `component`
(router, prefill, decode, aggregated), `process` (router, prefill-0, ...) and `node`. Grafana fills `$deployment`
(a variable of the dashboard) and `$__rate_interval`; tests/lifecycle/test_observe.py runs exactly these queries
against a real Prometheus scraping a simulated deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdctl import __version__

DEPLOYMENT = 'deployment="$deployment"'
RATE = "$__rate_interval"
UID = "pdctl-deployment"
TITLE = "pdctl: prefill/decode deployment"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"


def _rate(metric: str, match: str = "", by: str = "") -> str:
    sel = f"{{{DEPLOYMENT}{', ' + match if match else ''}}}"
    grouped = f"sum by ({by}) " if by else "sum "
    return f"{grouped}(rate({metric}{sel}[{RATE}]))"


def _quantiles(metric: str, match: str = "") -> tuple[Query, ...]:
    sel = f"{{{DEPLOYMENT}{', ' + match if match else ''}}}"
    return tuple(Query(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{sel}[{RATE}])))", f"p{int(q * 100)}")
                 for q in (0.5, 0.9, 0.99))


_ELIGIBLE = 'reason!~"new_conversation|not_eligible|n_gt_1"'
_REUSED = 'outcome=~"hit|partial"'
_D_TO_P = 'direction="d_to_p"'

PANELS: tuple[Panel, ...] = (
    Panel("Reuse hit rate", "Turns that reused a decode's KV (hit or partial) among those that could have: the same "
          "figure as /stats hit_rate, over the window.", "percentunit",
          (Query(f"{_rate('pdctl_router_kv_reuse_total', _REUSED)} / "
                 f"{_rate('pdctl_router_kv_reuse_total', _ELIGIBLE)}", "hit rate"),), kind="stat"),
    Panel("Turns per second", "Requests the router answered, by status (429 and 503: refused a slot).", "reqps",
          (Query(_rate("pdctl_router_requests_total", by="status"), "{{status}}"),)),
    Panel("TTFT at the router", "Time to the first streamed byte, as the router's clients see it (streamed turns).",
          "s", _quantiles("pdctl_router_ttft_seconds")),
    Panel("TTFT at the engines", "vLLM's time to first token on the decodes (it includes the P->D pull).", "s",
          _quantiles("vllm:time_to_first_token_seconds", 'component=~"decode|aggregated"')),
    Panel("Inter-token latency", "vLLM's time between a request's tokens on the decodes.", "s",
          _quantiles("vllm:inter_token_latency_seconds", 'component=~"decode|aggregated"')),
    Panel("Reuse outcome", "What each turn did with the decode's KV (X-PD-KV-Reuse outcome).", "ops",
          (Query(_rate("pdctl_router_kv_reuse_total", by="outcome"), "{{outcome}}"),)),
    Panel("Reuse reasons", "Why: every turn's reason (X-PD-KV-Reuse reason; docs/observability.md lists them).",
          "ops", (Query(_rate("pdctl_router_kv_reuse_total", by="outcome, reason"), "{{outcome}}: {{reason}}"),)),
    Panel("Where diverged prefixes differed", "For prefix_diverged turns: the first token of the first block that "
          "differed from what the decode held (X-PD-KV-Reuse block x block size).", "none",
          _quantiles("pdctl_router_prefix_diverged_tokens")),
    Panel("KV source per turn", "Where each turn's prompt KV came from: read back from the decode (D->P), the "
          "decode's own cache (a local turn), whole on a prefill, or recomputed.", "ops",
          (Query(_rate("pdctl_router_turn_kv_source_total", by="source"), "{{source}}"),)),
    Panel("KV source chosen per warm turn", "The cost model's choice for each warm turn: the decode alone "
          "(decode_cache), the prefill reading the history from the decode (decode_read), or recomputing it "
          "(recomputed); and why the decode alone was refused (its step would break router.itl_slo_ms or lengthen "
          "the other streams' step past 1.2x it, a prefill was cheaper, over router.local_prefill_tokens).", "ops",
          (Query(_rate("pdctl_router_kv_choice_total", by="source"), "{{source}}"),
           Query(_rate("pdctl_router_kv_choice_local_refused_total", by="why"), "decode alone refused: {{why}}"))),
    Panel("KV choice: predicted vs measured TTFT", "The time to first token the cost model predicted for the "
          "turns it chose, against the router's measurement of them (streamed turns), and the p90 of "
          "|measured - predicted|.", "s",
          (Query(f"histogram_quantile(0.5, sum by (le, kind) (rate(pdctl_router_kv_choice_ttft_seconds_bucket"
                 f"{{{DEPLOYMENT}}}[{RATE}])))", "{{kind}} p50"),
           Query(f"histogram_quantile(0.9, sum by (le) (rate(pdctl_router_kv_choice_error_seconds_bucket"
                 f"{{{DEPLOYMENT}}}[{RATE}])))", "|error| p90"))),
    Panel("Retained KV per decode", "The decode's KV held by retained blocks (kept for a conversation's next turn): "
          "each router's pins and all routers' together, against the decode's blocks in all, next to the "
          "decode's KV use as the router polls it (retain_high_kv: where releasing starts).", "percentunit",
          (Query(f"pdctl_router_retained_blocks{{{DEPLOYMENT}}} / pdctl_router_decode_kv_capacity_blocks"
                 f"{{{DEPLOYMENT}}}", "{{process}} pins, decode {{index}}"),
           Query(f"sum by (index) (pdctl_router_retained_blocks{{{DEPLOYMENT}}}) / max by (index) "
                 f"(pdctl_router_decode_kv_capacity_blocks{{{DEPLOYMENT}}})", "all routers' pins, decode {{index}}"),
           Query(f"max by (index) (pdctl_router_decode_kv_usage{{{DEPLOYMENT}}})", "KV used, decode {{index}}"))),
    Panel("Retention releases", "Retained KV released, by why: pressure (the decode above retain_high_kv, or "
          "requests waiting on it), single_turn (a conversation's last turn), reclaimed_at_start (an earlier "
          "router's pins), replaced, unread, shutdown; sent alone or carried on a turn's prefill request.", "ops",
          (Query(_rate("pdctl_router_kv_releases_total", 'result=~"sent|carried"', by="reason"), "{{reason}}"),)),
    Panel("Retained handles and release queue", "Each router's live handles per decode (each pins a "
          "conversation's KV there), and its releases submitted and not yet done.", "none",
          (Query(f"pdctl_router_retained_handles{{{DEPLOYMENT}}}", "{{process}} handles, decode {{index}}"),
           Query(f"pdctl_router_release_queue{{{DEPLOYMENT}}}", "{{process}} release queue"))),
    Panel("KV moved per turn (tokens)", "Per turn through a prefill: tokens the prefill read from the decode "
          "(d_to_p) and the prompt KV it offered the decode (p_to_d).", "none",
          (Query(f"{_rate('pdctl_router_kv_moved_tokens_sum', by='direction')} / "
                 f"{_rate('pdctl_router_kv_moved_tokens_count', by='direction')}", "{{direction}}"),)),
    Panel("KV moved per turn (NIXL bytes)", "Bytes the engines' NIXL reads moved per turn through a prefill: on "
          "the prefill the D->P reads, on the decode the P->D pulls.", "bytes",
          (Query(f"{_rate('vllm:nixl_bytes_transferred_sum', by='component')} / ignoring(component) group_left() "
                 f"{_rate('pdctl_router_kv_moved_tokens_count', _D_TO_P)}", "{{component}}"),)),
    Panel("Pinned KV per decode", "Decode KV tokens the router's live handles pin, and each decode's pin budget.",
          "none", (Query(f"pdctl_router_pinned_tokens{{{DEPLOYMENT}}}", "{{process}} pinned, decode {{index}}"),
                   Query(f"pdctl_router_pin_budget_tokens{{{DEPLOYMENT}}}", "{{process}} budget, decode {{index}}"))),
    Panel("Admission", "Requests holding a slot and waiting for one, per pool (router.max_inflight_per_instance).",
          "none", (Query(f"sum by (role) (pdctl_router_admission_inflight{{{DEPLOYMENT}}})", "{{role}} in flight"),
                   Query(f"sum by (role) (pdctl_router_admission_queued{{{DEPLOYMENT}}})", "{{role}} queued"))),
    Panel("Refusals", "Requests refused a slot: 429 (queue full), 503 (waited past queue_timeout).", "reqps",
          (Query(_rate("pdctl_router_admission_refused_total", by="role, status"), "{{role}} {{status}}"),)),
    Panel("Health", "1: up. Each scrape target (Prometheus's `up`), and each upstream in the router's pools.", "none",
          (Query(f"up{{{DEPLOYMENT}}}", "scrape {{process}}"),
           Query(f"pdctl_router_upstream_healthy{{{DEPLOYMENT}}}", "router pool {{role}} {{index}}"))),
    Panel("Load per instance", "Requests running and waiting on each engine, and in flight to it from the router.",
          "none", (Query(f"sum by (process) (vllm:num_requests_running{{{DEPLOYMENT}}})", "{{process}} running"),
                   Query(f"sum by (process) (vllm:num_requests_waiting{{{DEPLOYMENT}}})", "{{process}} waiting"),
                   Query(f"sum by (role, index) (pdctl_router_upstream_outstanding{{{DEPLOYMENT}}})",
                         "router -> {{role}} {{index}}"))),
    Panel("KV cache use per instance", "vLLM's KV cache usage on each engine (1 = full).", "percentunit",
          (Query(f"max by (process) (vllm:kv_cache_usage_perc{{{DEPLOYMENT}}})", "{{process}}"),)),
)


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard JSON, in panel order."""
    return [t["expr"] for p in dashboard.get("panels", []) for t in p.get("targets", [])]


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard JSON (schema 39; import it, or provision it from a file)."""
    ds = {"type": "prometheus", "uid": "${datasource}"}
    panels = [{
        "id": i + 1, "type": p.kind, "title": p.title, "description": p.description, "datasource": ds,
        "gridPos": _grid(i), "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if p.kind == "timeseries" else {},
        "targets": [{"refId": chr(ord("A") + j), "datasource": ds, "expr": q.expr, "legendFormat": q.legend}
                    for j, q in enumerate(p.queries)],
    } for i, p in enumerate(PANELS)]
    return {
        "uid": UID, "title": TITLE, "tags": ["pdctl", "vllm"], "schemaVersion": 39, "version": 1,
        "editable": True, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "description": f"pdctl {__version__}: the router's reuse, placement and admission, and the engines' "
                       "latency and load. Rendered by `pdctl observe`.",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "deployment", "type": "query", "datasource": ds, "label": "deployment", "refresh": 2,
             "query": {"query": "label_values(up{job=~\"pdctl-.*\"}, deployment)", "refId": "deployment"},
             "definition": "label_values(up{job=~\"pdctl-.*\"}, deployment)"},
        ]},
        "panels": panels,
    }


def _grid(i: int) -> dict[str, int]:
    """The hit rate and the turns side by side on top, then two panels a row."""
    if i < 2:
        return {"h": 8, "w": 6 if i == 0 else 18, "x": 0 if i == 0 else 6, "y": 0}
    k = i - 2
    return {"h": 8, "w": 12, "x": (k % 2) * 12, "y": 8 * (1 + k // 2)}
