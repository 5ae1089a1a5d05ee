"""Requests that are more than one conversation turn: a list of prompts, and n > 1 samples.

A list of prompts in /v1/completions is split into one P/D flow per prompt, each with its own conversation and
handle (an explicit conversation id gets `#<i>` appended per prompt), run concurrently; the answers are
reassembled in order as one `text_completion` (choice i is prompt i, usage summed, X-PD-KV-Reuse lists each
prompt's outcome). Streamed, the prompts run one after another into one stream, choice `index` set to the prompt's.
If any prompt fails, the whole batch answers that error, as vLLM does.

n > 1 (or best_of > 1) is served by a decode alone, without kv_transfer_params: n samples share one prompt but
a decode handle is single use, and vLLM promises nothing about a handle read by n children. Such a request is a
miss with reason `n_gt_1`, keeps no handle and leaves the conversation's own handle untouched.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import Message, Receive, Send

from pdctl.router import jsonx, wire
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.turn import decode, pipeline
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.disconnect import cancel_on_disconnect
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.sse import SseEvents

MAX_PROMPTS = 256


def prompts(body: dict[str, Any]) -> list[Any] | None:
    """The prompts of a batch (a list of strings or of token-id lists, two or more), else None."""
    p = body.get("prompt")
    if not isinstance(p, list) or len(p) < 2 or all(isinstance(t, int) for t in p):
        return None
    return p


def samples(body: dict[str, Any]) -> int:
    n = max(body.get("n") or 1, body.get("best_of") or 1) if _ints(body) else 0
    return n if isinstance(n, int) else 0


def _ints(body: dict[str, Any]) -> bool:
    return all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (body.get("n"),
                                                                                        body.get("best_of")))


class _Collect:
    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            self.body.append(message.get("body", b""))

    def header(self, name: bytes) -> bytes:
        return next((v for k, v in self.headers if k == name), b"")


async def completions(state: RouterState, ctx: RequestContext, receive: Receive, send: Send,
                      batch: list[Any]) -> None:
    if len(batch) > MAX_PROMPTS:
        await send_error(send, 400, f"a batch of {len(batch)} prompts is over the router's limit of {MAX_PROMPTS}; "
                         "split it into several requests")
        return
    if not all((isinstance(p, str) and p) or (isinstance(p, list) and p and all(isinstance(t, int) for t in p))
               for p in batch):
        await send_error(send, 400, "`prompt` must be a string, a list of token ids, or a list of non-empty "
                         "strings or token-id lists")
        return
    if ctx.body.get("stream"):
        await _streamed(state, ctx, receive, send, batch)
        return
    outs = [_Collect() for _ in batch]
    await asyncio.gather(*(pipeline.completion(state, ctx.prompt(i, p), receive, outs[i]) for i, p in enumerate(batch)))
    failed = next((o for o in outs if o.status != 200), None)
    if failed is not None:
        await send_bytes(send, failed.status, b"".join(failed.body))
        return
    parts = [jsonx.loads(b"".join(o.body)) for o in outs]
    merged = dict(parts[0])
    merged["choices"] = [{**p["choices"][0], "index": i} for i, p in enumerate(parts)]
    usage = [p.get("usage") or {} for p in parts]
    merged["usage"] = {k: sum(u.get(k) or 0 for u in usage) for k in ("prompt_tokens", "completion_tokens",
                                                                      "total_tokens")}
    await send_bytes(send, 200, jsonx.dumps(merged), _headers(outs))


def _headers(outs: list[_Collect]) -> list[tuple[bytes, bytes]]:
    ms = max(float(o.header(wire.PREFILL_MS_HEADER.encode()) or 0) for o in outs)
    return [wire.raw_ms(wire.PREFILL_MS_HEADER, ms),
            (wire.REUSE_HEADER.encode(), b", ".join(o.header(wire.REUSE_HEADER.encode()) for o in outs))]


async def _streamed(state: RouterState, ctx: RequestContext, receive: Receive, send: Send, batch: list[Any]) -> None:
    started = [False]
    for i, p in enumerate(batch):
        stream = _Relay(send, i, last=i == len(batch) - 1, started=started)
        await pipeline.completion(state, ctx.prompt(i, p), receive, stream)
        if stream.failed:
            return


class _Relay:
    """One prompt's stream into the batch's: one response start, choice index rewritten, one [DONE] at the end."""

    def __init__(self, send: Send, index: int, last: bool, started: list[bool]) -> None:
        self.send, self.index, self.last, self.started = send, index, last, started
        self.failed = False
        self._error = False
        self._relayed = False
        self._error_body = b""
        self._events = SseEvents()

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._error = message["status"] != 200
            self.failed = self._error
            if not self.started[0]:
                self.started[0] = True
                self._relayed = True  # the batch's response starts with this prompt's answer, whatever it is
                await self.send(message)
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        more = message.get("more_body", False)
        if self._error and self._relayed:
            await self.send(message)
        elif self._error:  # an error answer inside the batch's stream becomes its error event
            self._error_body += message.get("body", b"")
            if not more:
                event = b"data: " + self._error_body + b"\n\ndata: [DONE]\n\n"
                await self.send({"type": "http.response.body", "body": event, "more_body": False})
        else:
            out = self._rewrite(message.get("body", b""))
            await self.send({"type": "http.response.body", "body": out,
                             "more_body": more or not (self.last or self.failed)})

    def _rewrite(self, data: bytes) -> bytes:
        out = []
        for event in self._events.feed(data):
            event = event.strip(b"\r\n")
            if event == b"data: [DONE]":
                if self.last and not self.failed:
                    out.append(event + b"\n\n")
                continue
            if event.startswith(b"data:"):
                try:
                    obj = jsonx.loads(event[5:])
                except (jsonx.DecodeError, ValueError):
                    obj = None
                if isinstance(obj, dict):
                    for choice in obj.get("choices") or ():
                        if isinstance(choice, dict):
                            choice["index"] = self.index
                    if "error" in obj:
                        self.failed = True
                        out.append(b"data: " + jsonx.dumps(obj) + b"\n\ndata: [DONE]")
                        continue
                    event = b"data: " + jsonx.dumps(obj)
            out.append(event + b"\n\n")
        return b"".join(out)


async def sampled(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    """n > 1: the request on one decode alone, a miss that keeps no handle; admitted through the decode's gate
    and cancelled upstream when its client leaves, like every other turn."""
    await cancel_on_disconnect(receive, send, lambda out: _sampled(state, ctx, receive, out))


async def _sampled(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    ctx.started = time.perf_counter()
    if not state.decode.healthy():
        await send_error(send, 503, f"no healthy decode instance (0 of {len(state.decode.members)} healthy)")
        return
    headers = [wire.raw_ms(wire.PREFILL_MS_HEADER, 0.0), wire.Reuse("miss", 0, wire.N_GT_1).raw()]
    if not await state.decode_gate.admit(send, headers):
        return
    try:
        res = await decode.run(state, ctx, receive, send, None, headers)
    finally:
        state.decode_gate.release()
    state.metrics.reuse_outcome("miss", wire.N_GT_1, 0, False)
    if not res.sent:
        await send_error(send, 502, "no working decode instance could serve the request", headers)
