"""Traces of a turn (OpenTelemetry, opt-in with `--otlp-endpoint`): one span per turn, a child per stage.

    turn                     the whole turn, entry to the response's last byte          (kind SERVER)
      router_in              the router's own time before the prefill hop (X-PD-Router-In-Ms)
        verification         what the turn does with the handle (a /tokenize with verify_at: router)
      prefill                the prefill hop (X-PD-Prefill-Ms)                          (kind CLIENT)
        kv.read d->p         the prefill reading the decode's verified tokens, inside the hop
      decode                 decode request to its first byte (X-PD-Decode-Ms)         (kind CLIENT)
        kv.pull p->d         the decode pulling the prefill's KV, inside that wait
The two KV spans carry the tokens moved and span their parent's interval: the router sees the hop, not the
transfer inside it (the engines' own NIXL metrics and traces time that). The turn's span carries the conversation's
hash, the reuse outcome, reason and, for a diverged prefix, the first block that differed.

A client's W3C `traceparent` makes the turn's span a child of the client's span, in the client's trace (a
`traceparent` whose sampled flag is off is honoured: no trace); the prefill and decode requests carry a
`traceparent` of their own spans, so engines that trace (vLLM's --otlp-traces-endpoint) nest under them.

Cost: with tracing off `RouterState.tracer` is None and every stage's check is one attribute read. With it on a turn
records a few small objects; encoding and sending happen in the exporter's task (server/otlp.py), never on a turn,
and a finished trace that finds the queue full is dropped and counted, never waited for.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from starlette.types import Message, Send

from pdctl.router.wire import Reuse

# perf_counter seconds -> Unix nanoseconds (spans are timed with perf_counter, exported in wall-clock time).
_EPOCH_NS: Final = time.time_ns() - time.perf_counter_ns()
INTERNAL, SERVER, CLIENT = 1, 2, 3  # OTLP SpanKind
Attr = str | int | float | bool


def unix_ns(t: float) -> int:
    return _EPOCH_NS + int(t * 1e9)


def _new_id(nbytes: int) -> bytes:
    while True:
        b = random.getrandbits(nbytes * 8).to_bytes(nbytes, "big")
        if any(b):  # an all-zero id is invalid
            return b


@dataclass(slots=True)
class Span:
    name: str
    span_id: bytes
    parent: bytes  # b"": none (a root without a client parent)
    start: float  # perf_counter
    end: float
    kind: int = INTERNAL
    attrs: dict[str, Attr] = field(default_factory=dict)
    error: bool = False


def parse_traceparent(value: bytes | None) -> tuple[bytes, bytes, bool] | None:
    """(trace id, parent span id, sampled) of a W3C `traceparent` header; None when absent or invalid."""
    if not value:
        return None
    parts = value.strip().split(b"-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == b"ff" or len(parts[1]) != 32 or len(parts[2]) != 16 \
            or len(parts[3]) != 2 or (parts[0] == b"00" and len(parts) != 4):
        return None
    try:
        trace_id, parent, flags = bytes.fromhex(parts[1].decode()), bytes.fromhex(parts[2].decode()), \
            int(parts[3], 16)
    except ValueError:
        return None
    if not any(trace_id) or not any(parent):
        return None
    return trace_id, parent, bool(flags & 1)


class Trace:
    """One turn's spans, filled in by the stages as they run; finished and queued by the Tracer."""

    __slots__ = ("parent", "reuse", "root", "spans", "status", "trace_id")

    def __init__(self, trace_id: bytes, parent: bytes, t0: float, name: str) -> None:
        self.trace_id = trace_id
        self.parent = parent
        self.root = Span(name, _new_id(8), parent, t0, t0, SERVER)
        self.spans: list[Span] = []
        self.status = 0
        self.reuse: Reuse | None = None

    def new_id(self) -> bytes:
        """A span id to hand to an upstream before its span is recorded (`traceparent`, then `span(..., span_id=)`)."""
        return _new_id(8)

    def span(self, name: str, start: float, end: float, attrs: dict[str, Attr] | None = None,
             parent: bytes | None = None, kind: int = INTERNAL, span_id: bytes | None = None,
             error: bool = False) -> bytes:
        """Record a finished stage (perf_counter times), under `parent` (default: the turn); returns its id."""
        sid = span_id or _new_id(8)
        self.spans.append(Span(name, sid, parent or self.root.span_id, start, end, kind, attrs or {}, error))
        return sid

    def traceparent(self, span_id: bytes) -> tuple[bytes, bytes]:
        """The `traceparent` header an upstream request carries, its span `span_id`."""
        return b"traceparent", f"00-{self.trace_id.hex()}-{span_id.hex()}-01".encode()

    def outcome(self, reuse: Reuse, conversation: str | None) -> None:
        """The turn's reuse, on the turn's span (the first hop's: a redone hop does not change what the turn was)."""
        if self.reuse is not None:
            return
        self.reuse = reuse
        a = self.root.attrs
        a["pdctl.kv.outcome"] = reuse.outcome
        a["pdctl.kv.reason"] = reuse.reason
        a["pdctl.kv.tokens"] = reuse.tokens
        a["pdctl.kv.source"] = reuse.source
        a["pdctl.kv.explanation"] = reuse.explanation
        if reuse.block is not None:
            a["pdctl.kv.diverged_block"] = reuse.block
        if conversation is not None:
            a["pdctl.conversation.hash"] = conversation_hash(conversation)

    def watch(self, send: Send) -> Send:
        """`send`, noting the response's status for the turn's span."""
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            await send(message)
        return watched


def conversation_hash(conversation: str) -> str:
    """What a trace says of the conversation: enough to group its turns, nothing of its id."""
    return hashlib.blake2b(conversation.encode(), digest_size=8).hexdigest()


class Tracer:
    """Starts and finishes the turns' traces and queues the finished ones for the exporter (bounded: a full queue
    drops the newest and counts it)."""

    def __init__(self, max_queue: int, counted: Callable[[str, int], None] | None = None) -> None:
        self.max_queue = max_queue
        self.queue: deque[Trace] = deque()
        self.counted = counted or (lambda result, n: None)

    def begin(self, headers: list[tuple[bytes, bytes]], t0: float, method: str, path: str, rid: str) -> Trace | None:
        """A trace for the request, a child of the client's `traceparent` when it sent one; None when the client's
        context says not sampled."""
        given = parse_traceparent(next((v for k, v in headers if k == b"traceparent"), None))
        if given is not None and not given[2]:
            return None
        trace_id, parent = (given[0], given[1]) if given is not None else (_new_id(16), b"")
        tr = Trace(trace_id, parent, t0, f"{method} {path}")
        a = tr.root.attrs
        a["http.request.method"] = method
        a["url.path"] = path
        a["pdctl.request_id"] = rid
        return tr

    def finish(self, tr: Trace, end: float) -> None:
        tr.root.end = end
        tr.root.attrs["http.response.status_code"] = tr.status
        tr.root.error = tr.status >= 500 or tr.status == 0
        if len(self.queue) >= self.max_queue:
            self.counted("dropped", 1 + len(tr.spans))
            return
        self.queue.append(tr)
