"""The async client: plays conversations against the router with streaming requests and times each turn.

TTFT is measured to the first chunk with non-empty content, as vLLM's multi-turn benchmark does; TPOT is the
time after it divided by the remaining output tokens. `clients` workers each play one conversation at a time,
turn after turn; `rate` > 0 spaces each worker's requests with Poisson arrivals.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from pdctl.bench.results.records import RequestRecord
from pdctl.bench.traffic.workload import Api, Conversation
from pdctl.router import wire
from pdctl.secret import bearer

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}


@dataclass(frozen=True)
class ClientOptions:
    url: str
    model: str
    api: Api = "chat"
    output_tokens: int = 300
    clients: int = 1
    rate: float = 0.0
    timeout: float = 600.0
    api_key: str | None = None
    seed: int = 0


@dataclass
class _Reply:
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    chunks: int = 0
    usage: dict[str, Any] | None = None
    first: float | None = None
    last: float | None = None
    max_gap: float = 0.0
    error: str | None = None


async def play(
    conversations: list[Conversation],
    opts: ClientOptions,
    leg: str,
    on_record: Callable[[RequestRecord], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RequestRecord]:
    """Play every conversation to its last turn (or its first failed turn) and return one record per request."""
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conv in conversations:
        queue.put_nowait(conv)
    async with player(opts, leg, opts.clients, on_record, transport) as p:

        async def worker(client_id: int) -> None:
            rng = random.Random(opts.seed * 1000 + client_id)
            while not queue.empty():
                conv = queue.get_nowait()
                while not conv.done:
                    if opts.rate > 0:
                        await asyncio.sleep(rng.expovariate(opts.rate))
                    if not await p.turn(conv, client_id):
                        break

        await asyncio.gather(*(worker(i) for i in range(max(1, opts.clients))))
    return p.records


class Player:
    """Plays conversations' turns over one HTTP client: one record per request, each reported to `on_record`."""

    def __init__(self, client: httpx.AsyncClient, opts: ClientOptions, leg: str,
                 on_record: Callable[[RequestRecord], None] | None) -> None:
        self.client, self.opts, self.leg, self.on_record = client, opts, leg, on_record
        self.records: list[RequestRecord] = []

    async def turn(self, conv: Conversation, client_id: int) -> bool:
        """Send the conversation's next turn and advance it by the reply; False when the turn failed."""
        rec, reply = await send(self.client, conv, self.opts, self.leg, client_id)
        self.records.append(rec)
        if self.on_record is not None:
            self.on_record(rec)
        if not rec.ok:
            return False
        conv.advance("".join(reply.text), reply.ids)
        return True


@asynccontextmanager
async def player(
    opts: ClientOptions, leg: str, concurrency: int, on_record: Callable[[RequestRecord], None] | None,
    transport: httpx.AsyncBaseTransport | None,
) -> AsyncIterator[Player]:
    """A Player whose client keeps a connection for each of `concurrency` conversations played at once."""
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    timeout = httpx.Timeout(opts.timeout, connect=10.0)
    async with httpx.AsyncClient(base_url=opts.url, timeout=timeout, limits=limits, transport=transport) as client:
        yield Player(client, opts, leg, on_record)


async def send(
    client: httpx.AsyncClient, conv: Conversation, opts: ClientOptions, leg: str, client_id: int = 0
) -> tuple[RequestRecord, _Reply]:
    body = conv.body(opts.model, opts.output_tokens)
    headers = {"X-Session-ID": conv.conversation_id, **bearer(opts.api_key)}
    rec = RequestRecord(
        leg=leg,
        length=conv.plan.length,
        conversation_id=conv.conversation_id,
        turn=conv.turn,
        api=opts.api,
        client_id=client_id,
        input_num_turns=len(body.get("messages", [])) or conv.turn + 1,
    )
    reply = _Reply()
    start = time.perf_counter()
    rec.start_time_ms = start * 1000.0
    try:
        async with client.stream("POST", PATHS[opts.api], json=body, headers=headers) as resp:
            rec.status = resp.status_code
            rec.request_id = resp.headers.get("x-request-id")
            rec.prefill_ms = wire.parse_ms(resp.headers.get(wire.PREFILL_MS_HEADER))
            rec.router_in_ms = wire.parse_ms(resp.headers.get(wire.ROUTER_IN_MS_HEADER))
            rec.decode_ms = wire.parse_ms(resp.headers.get(wire.DECODE_MS_HEADER))
            reuse = wire.Reuse.parse(resp.headers.get(wire.REUSE_HEADER))
            if reuse.outcome != "absent":
                rec.reuse, rec.reuse_tokens, rec.reuse_reason = reuse.outcome, reuse.tokens, reuse.reason or None
                rec.reuse_read = reuse.read
                rec.reuse_cached = reuse.cached
            choice = wire.KvChoice.parse(resp.headers.get(wire.KV_CHOICE_HEADER))
            if choice is not None:
                rec.kv_choice, rec.kv_choice_basis = choice.source, choice.basis
                rec.kv_choice_predicted_ms, rec.kv_choice_refused = choice.predicted_ms, choice.refused
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {_error_message(await resp.aread())}"
            else:
                await _read_stream(resp, opts.api, reply)
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    end = time.perf_counter()
    rec.error = rec.error or reply.error
    _finish(rec, reply, start, end, body)
    return rec, reply


async def _read_stream(resp: httpx.Response, api: Api, reply: _Reply) -> None:
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            reply.error = f"unparsable stream chunk: {data[:120]}"
            return
        if "error" in chunk:
            reply.error = f"stream error: {_error_message(json.dumps(chunk).encode())}"
            return
        if api in ("responses", "messages"):
            _agent_event(chunk, reply)
            continue
        if chunk.get("usage"):
            reply.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if api == "chat" else choice.get("text")
            if text:
                _text(reply, text)
            reply.ids.extend(choice.get("token_ids") or [])


def _agent_event(event: dict[str, Any], reply: _Reply) -> None:
    """One event of a Responses or Messages stream: its text, or the usage it reports at the end."""
    kind = event.get("type")
    delta = event.get("delta")
    text = None
    if kind == "response.output_text.delta":
        text = delta
    elif kind == "content_block_delta" and isinstance(delta, dict) and delta.get("type") == "text_delta":
        text = delta.get("text")
    if isinstance(text, str) and text:
        _text(reply, text)
    usage = (event.get("response") or {}).get("usage") if kind == "response.completed" else \
        event.get("usage") if kind == "message_delta" else None
    if isinstance(usage, dict):
        reply.usage = {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens")}


def _text(reply: _Reply, text: str) -> None:
    now = time.perf_counter()
    if reply.first is None:
        reply.first = now
    if reply.last is not None:
        reply.max_gap = max(reply.max_gap, now - reply.last)
    reply.last = now
    reply.text.append(text)
    reply.chunks += 1


def _finish(rec: RequestRecord, reply: _Reply, start: float, end: float, body: dict[str, Any]) -> None:
    rec.latency_ms = (end - start) * 1000.0
    usage = reply.usage or {}
    rec.output_num_tokens = int(usage.get("completion_tokens") or len(reply.ids) or reply.chunks)
    rec.output_num_chunks = reply.chunks
    if usage.get("prompt_tokens"):
        rec.input_num_tokens = int(usage["prompt_tokens"])
    elif "prompt" in body:
        rec.input_num_tokens, rec.input_tokens_source = len(body["prompt"]), "prompt"
    else:
        rec.input_tokens_source = "unknown"
    if reply.first is not None:
        rec.ttft_ms = (reply.first - start) * 1000.0
        if rec.output_num_tokens > 1:
            rec.tpot_ms = (end - reply.first) * 1000.0 / (rec.output_num_tokens - 1)
        if reply.chunks > 1:
            rec.itl_max_ms = reply.max_gap * 1000.0


def _error_message(raw: bytes) -> str:
    """The message of an OpenAI- or Anthropic-shaped error body, else the start of the body."""
    try:
        data = json.loads(raw)
        err = data.get("error", data)  # Anthropic's {"type": "error", "error": {...}} has it there too
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg or data)[:300]
    except (ValueError, AttributeError):
        return raw.decode(errors="replace")[:300]
