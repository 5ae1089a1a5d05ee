"""The OTLP/HTTP exporter of the turns' traces (turn/trace.py): JSON, batched, in a task of its own.

Every `interval` seconds it takes up to `max_batch` finished traces off the tracer's queue, encodes them as one
`ExportTraceServiceRequest` (OTLP's JSON encoding: hex ids, nanosecond times as strings) in a worker thread, so the
event loop keeps serving turns meanwhile (about 60 us of encoding per trace), and POSTs it to the endpoint. A turn
never waits for it: a collector that is slow or down costs only this task's time; a failed
export is counted and logged (once a minute at most), and its traces are dropped rather than retried, so the queue
stays bounded.

Hand-written rather than the opentelemetry-sdk: the router needs one span kind of exporter and no API for
third-party instrumentation, the SDK would add several packages to every router node, and its span objects and
context propagation would cost a warm turn more than the few objects recorded here (docs/observability.md).

The endpoint: `--otlp-endpoint http://collector:4318` sends to `/v1/traces` there (as OTEL_EXPORTER_OTLP_ENDPOINT
does); a URL whose path already ends in `/v1/traces` is used as it is. Headers for the collector (an API key) come
from OTEL_EXPORTER_OTLP_TRACES_HEADERS or OTEL_EXPORTER_OTLP_HEADERS (`k=v,k2=v2`, URL-encoded values), never argv.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any
from urllib.parse import unquote

import httpx

from pdctl import __version__
from pdctl.router import jsonx
from pdctl.router.turn.trace import Attr, Span, Trace, Tracer, unix_ns

log = logging.getLogger("pdctl.router")

TRACES_PATH = "/v1/traces"
WARN_EVERY_S = 60.0


def traces_url(endpoint: str) -> str:
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def env_headers(env: dict[str, str] | None = None) -> dict[str, str]:
    """The collector's headers from the OpenTelemetry variables (the traces-specific one wins)."""
    env = dict(os.environ) if env is None else env
    raw = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    out: dict[str, str] = {}
    for part in raw.split(","):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            out[key.strip().lower()] = unquote(value.strip())
    return out


def _value(v: Attr) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": v}


def _attrs(attrs: dict[str, Attr]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in attrs.items()]


def _span(trace_id: str, s: Span) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": trace_id, "spanId": s.span_id.hex(), "name": s.name, "kind": s.kind,
        "startTimeUnixNano": str(unix_ns(s.start)), "endTimeUnixNano": str(unix_ns(max(s.end, s.start))),
        "attributes": _attrs(s.attrs), "status": {"code": 2 if s.error else 0},
    }
    if s.parent:
        out["parentSpanId"] = s.parent.hex()
    return out


def encode(traces: list[Trace], service: str) -> dict[str, Any]:
    """One ExportTraceServiceRequest (OTLP JSON) of `traces`."""
    spans = [_span(t.trace_id.hex(), s) for t in traces for s in (t.root, *t.spans)]
    resource = {"attributes": _attrs({"service.name": service, "service.version": __version__,
                                      "telemetry.sdk.name": "pdctl", "telemetry.sdk.language": "python"})}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [
        {"scope": {"name": "pdctl.router", "version": __version__}, "spans": spans}]}]}


class OtlpExporter:
    def __init__(self, tracer: Tracer, endpoint: str, service: str, interval: float = 1.0, max_batch: int = 128,
                 timeout: float = 5.0) -> None:
        self.tracer = tracer
        self.url = traces_url(endpoint)
        self.service = service
        self.interval = interval
        self.max_batch = max_batch
        # Its own client: the router's carries the engine key, which must never reach a collector.
        self.client = httpx.AsyncClient(timeout=timeout, headers={"content-type": "application/json",
                                                                  **env_headers()})
        self._warned = -WARN_EVERY_S

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            while self.tracer.queue:
                await self.flush()

    async def flush(self) -> None:
        """Send up to `max_batch` queued traces (one request)."""
        q = self.tracer.queue
        batch = [q.popleft() for _ in range(min(len(q), self.max_batch))]
        if not batch:
            return
        spans = sum(1 + len(t.spans) for t in batch)
        try:
            body = await asyncio.to_thread(lambda: jsonx.dumps(encode(batch, self.service)))
            resp = await self.client.post(self.url, content=body)
            ok, why = resp.status_code < 300, f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, type(exc).__name__
        self.tracer.counted("exported" if ok else "failed", spans)
        if not ok and time.monotonic() - self._warned >= WARN_EVERY_S:
            self._warned = time.monotonic()
            log.warning("OTLP export to %s failed (%s): %d spans dropped (warned once a minute at most)",
                        self.url, why, spans)

    async def close(self) -> None:
        """Send what is queued (a bounded wait), then close the client."""
        try:
            async with asyncio.timeout(5.0):
                while self.tracer.queue:
                    await self.flush()
        except TimeoutError:
            pass
        finally:
            await self.client.aclose()
