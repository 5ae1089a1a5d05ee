"""OpenTelemetry traces of a turn: a real router exports OTLP/HTTP JSON to an in-process collector (a small HTTP
server here), one trace per turn with its stage spans, the client's `traceparent` its parent."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from pdctl.router.server.otlp import encode, env_headers, traces_url
from pdctl.router.turn.trace import Tracer, parse_traceparent
from pdctl.router.wire import KV_CHOICE_HEADER, KvChoice, Reuse
from tests.router.conftest import router_process
from tests.support.sim_procs import SimPair


class Collector:
    """Receives OTLP/HTTP JSON exports on POST /v1/traces; keeps every span with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/json"
                if ok:
                    doc = json.loads(body)
                    with collector.lock:
                        collector.requests += 1
                        for rs in doc["resourceSpans"]:
                            service = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                            for ss in rs["scopeSpans"]:
                                for s in ss["spans"]:
                                    collector.spans.append({**s, "service": service})
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def trace(self, trace_id: str, want: int, timeout: float = 15.0) -> list[dict[str, Any]]:
        """The spans of `trace_id`, once there are at least `want` of them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s["traceId"] == trace_id]
            if len(found) >= want:
                return found
            time.sleep(0.1)
        raise AssertionError(f"trace {trace_id}: {len(found)} spans, wanted {want}: {found}")


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span["attributes"]:
        v = a["value"]
        out[a["key"]] = int(v["intValue"]) if "intValue" in v else next(iter(v.values()))
    return out


def _turn(client: httpx.Client, url: str, cid: str, messages: list[dict[str, str]], traceparent: str | None,
          stream: bool) -> tuple[Reuse, str, KvChoice | None]:
    body = {"model": "Qwen", "messages": messages, "max_tokens": 6, "stream": stream, "conversation_id": cid}
    headers = {"traceparent": traceparent} if traceparent else {}
    if stream:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            text = ""
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text += "".join(c.get("delta", {}).get("content") or "" for c in json.loads(line[6:])["choices"])
            return Reuse.parse(r.headers.get("x-pd-kv-reuse")), text, KvChoice.parse(r.headers.get(KV_CHOICE_HEADER))
    r = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    said = KvChoice.parse(r.headers.get(KV_CHOICE_HEADER))
    return Reuse.parse(r.headers.get("x-pd-kv-reuse")), r.json()["choices"][0]["message"]["content"], said


def test_one_trace_per_turn_with_the_stage_spans_under_the_clients_span(
        pd: SimPair, collector: Collector, tmp_path: Path) -> None:
    with router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--otlp-endpoint", collector.url,
                        "--otlp-service-name", "router-under-test", name="traced") as router, \
            httpx.Client(timeout=30) as client:
        cid = uuid.uuid4().hex
        msgs = [{"role": "user", "content": "a first question " + "about the sea " * 120}]
        turns = []
        for n in range(3):
            trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
            reuse, text, said = _turn(client, router.url, cid, msgs, f"00-{trace_id}-{parent}-01", stream=n != 1)
            turns.append((trace_id, parent, reuse, said))
            msgs = [*msgs, {"role": "assistant", "content": text}, {"role": "user", "content": f"and {n}?"}]
        # an edited history: a miss that says where the prefix diverged
        trace_id, parent = os.urandom(16).hex(), os.urandom(8).hex()
        msgs[0] = {"role": "user", "content": "an edited question " + "about the sea " * 120}
        reuse, _, said = _turn(client, router.url, cid, msgs, f"00-{trace_id}-{parent}-01", stream=True)
        turns.append((trace_id, parent, reuse, said))
        # not sampled by the client: no trace
        unsampled = os.urandom(16).hex()
        _turn(client, router.url, uuid.uuid4().hex, msgs[:1], f"00-{unsampled}-{os.urandom(8).hex()}-00", False)
        # no traceparent: a trace of the router's own
        _turn(client, router.url, uuid.uuid4().hex, msgs[:1], None, False)
        metrics = ""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            metrics = httpx.get(f"{router.url}/metrics", timeout=10).text
            if 'pdctl_router_trace_spans_total{result="exported"}' in metrics:
                break
            time.sleep(0.2)

    hashes = set()
    for i, (trace_id, parent, reuse, said) in enumerate(turns):
        spans = collector.trace(trace_id, 5)
        roots = [s for s in spans if s.get("parentSpanId") == parent]
        assert len(roots) == 1, spans  # one turn, one span under the client's
        root = roots[0]
        assert root["kind"] == 2 and root["name"] == "POST /v1/chat/completions"
        assert root["service"]["service.name"] == {"stringValue": "router-under-test"}
        a = _attrs(root)
        assert (a["pdctl.kv.outcome"], a["pdctl.kv.reason"], a["pdctl.kv.tokens"]) == (
            reuse.outcome, reuse.reason, reuse.tokens)
        assert a["http.response.status_code"] == 200
        hashes.add(a["pdctl.conversation.hash"])
        by_name = {s["name"]: s for s in spans}
        for stage in ("router_in", "verification", "prefill", "decode"):
            assert stage in by_name, (stage, sorted(by_name))
        assert by_name["router_in"]["parentSpanId"] == root["spanId"]
        assert by_name["prefill"]["parentSpanId"] == root["spanId"]
        assert by_name["decode"]["parentSpanId"] == root["spanId"]
        assert by_name["kv.pull p->d"]["parentSpanId"] == by_name["decode"]["spanId"]
        start, end = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
        for s in spans:
            assert start <= int(s["startTimeUnixNano"]) <= int(s["endTimeUnixNano"]) <= end + 1_000_000, s
        assert int(by_name["prefill"]["endTimeUnixNano"]) <= int(by_name["decode"]["startTimeUnixNano"]) + 1_000_000
        if i in (1, 2):  # warm turns read the decode's KV back
            assert reuse.outcome == "hit", reuse
            assert by_name["kv.read d->p"]["parentSpanId"] == by_name["prefill"]["spanId"]
            assert _attrs(by_name["kv.read d->p"])["pdctl.kv.tokens"] == reuse.tokens > 0
            # the cost model's choice for the warm turn (the router's test default: read whatever it lacks)
            assert (a["pdctl.kv.choice"], a["pdctl.kv.choice.min_read"]) == ("decode_read", 0), a
            assert a["pdctl.kv.choice.basis"] in ("model", "default")
            assert ("pdctl.kv.choice.measured_ttft_ms" in a) == (i == 2)  # streamed turns only
            # its predicted TTFT where the model chose (as X-PD-KV-Choice says it), beside the measured one
            model = a["pdctl.kv.choice.basis"] == "model"
            assert ("pdctl.kv.choice.predicted_ttft_ms" in a) == model, a
            assert said is not None and (said.source, said.basis) == (a["pdctl.kv.choice"], a["pdctl.kv.choice.basis"])
            assert said.predicted_ms == (a["pdctl.kv.choice.predicted_ttft_ms"] if model else None)
        if i == 0:
            assert "pdctl.kv.choice" not in a  # a cold turn: nothing to choose
        if i == 3:
            assert (reuse.outcome, reuse.reason, reuse.block) == ("miss", "prefix_diverged", 0)
            assert a["pdctl.kv.diverged_block"] == 0 and "first differing block 0" in a["pdctl.kv.explanation"]
    assert len(hashes) == 1  # the turns of one conversation
    assert not [s for s in collector.spans if s["traceId"] == unsampled]
    own = [s for s in collector.spans if s["name"] == "POST /v1/chat/completions" and "parentSpanId" not in s]
    assert own, "a turn without a traceparent gets a trace of its own"
    assert 'pdctl_router_trace_spans_total{result="exported"}' in metrics


def test_traceparent_parsing() -> None:
    tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    assert parse_traceparent(f"00-{tid}-{sid}-01".encode()) == (bytes.fromhex(tid), bytes.fromhex(sid), True)
    assert parse_traceparent(f"00-{tid}-{sid}-00".encode()) == (bytes.fromhex(tid), bytes.fromhex(sid), False)
    for bad in (b"", b"00-xyz", f"00-{'0' * 32}-{sid}-01".encode(), f"ff-{tid}-{sid}-01".encode(),
                f"00-{tid}-{'0' * 16}-01".encode(), f"00-{tid}-{sid}-01-extra".encode()):
        assert parse_traceparent(bad) is None, bad
    assert parse_traceparent(f"01-{tid}-{sid}-01-future".encode()) is not None  # a later version's extra fields


def test_a_full_queue_drops_and_counts_never_waits() -> None:
    counted: list[tuple[str, int]] = []
    tracer = Tracer(2, lambda result, n: counted.append((result, n)))
    for _ in range(3):
        tr = tracer.begin([], time.perf_counter(), "POST", "/v1/completions", "rid")
        assert tr is not None
        tr.span("decode", time.perf_counter(), time.perf_counter())
        tracer.finish(tr, time.perf_counter())
    assert len(tracer.queue) == 2 and counted == [("dropped", 2)]
    doc = encode(list(tracer.queue), "svc")
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans) == 4 and all(len(s["traceId"]) == 32 and len(s["spanId"]) == 16 for s in spans)


def test_endpoint_and_headers() -> None:
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces/") == "http://c:4318/v1/traces"
    assert env_headers({"OTEL_EXPORTER_OTLP_HEADERS": "Api-Key=a%3Db, x=1"}) == {"api-key": "a=b", "x": "1"}
    assert env_headers({"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2"}) == {"b": "2"}
