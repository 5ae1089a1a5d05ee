"""Aggregated mode (`--mode aggregated`): every request whole to one engine, picked by conversation affinity.

Each engine computes a request's prompt and generates its answer itself, its prefix cache keeping what earlier turns
computed, so the router's one decision is where: the engine that served the conversation's last turn
(kv/affinity.py), else the least loaded. Chat, completions, and the agent APIs translated into chat (Responses,
Messages) come here through pipeline.completion, a list of prompts one prompt at a time (api/batches.py, as in P/D
mode; n > 1 goes to one engine there too). What the router does not do here: no kv_transfer_params, no /tokenize, no
handles, no prefix verification, no token ids asked for. The forwarding is whole.py's: the answer passes through as
the engine sent it (its body and status, never its headers or address); only a derived conversation's reply is read
on the side, to know its next request.

An engine that refuses the connection, resets it or answers 5xx before the first byte never gave the client
anything: the request goes to the next best engine. One that fails mid-stream ends the client's stream with an
SSE error event and is ejected unless it was merely slow.
"""

from __future__ import annotations

import logging
import time

from starlette.types import Receive, Send

from pdctl.router import jsonx
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.kv.conversation import Derivation
from pdctl.router.turn import placement, request
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.disconnect import cancel_on_disconnect
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.whole import Via, attempt
from pdctl.router.upstream.pools import Upstream

log = logging.getLogger("pdctl.router")


async def completion(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    if await cancel_on_disconnect(receive, send, lambda out: _completion(state, ctx, out)):
        log.info("[%s] client disconnected; its engine request was cancelled", ctx.rid)


def _conversation(state: RouterState, ctx: RequestContext) -> tuple[str | None, Derivation | None]:
    if ctx.chat and not (isinstance(ctx.body.get("messages"), list) and ctx.body["messages"]):
        return None, None  # the engine answers what is wrong with it
    return request.conversation(state, ctx)


async def _completion(state: RouterState, ctx: RequestContext, send: Send) -> None:
    ctx.started = time.perf_counter()
    pool = state.decode
    if not pool.healthy():
        await send_error(send, 503, f"no healthy engine ({len(pool.healthy())} of {len(pool.members)} healthy)")
        return
    cid, ctx.derivation = _conversation(state, ctx)
    ctx.conversation = cid
    if not await state.decode_gate.admit(send):
        return
    try:
        await _forward(state, ctx, send)
    finally:
        state.decode_gate.release()


async def _forward(state: RouterState, ctx: RequestContext, send: Send) -> None:
    cid = ctx.conversation
    last = state.affinity.get(cid) if cid is not None else None
    payload = jsonx.dumps(ctx.body)
    tokens = placement.prompt_tokens(ctx.body)
    tried: list[Upstream] = []
    error = b""
    via = Via(state.decode, state.affinity)
    for _ in state.decode.members:
        u = state.engine_choice.pick(state.decode, last, exclude=tried)
        if u is None:
            break
        tried.append(u)
        out = await attempt(state, ctx, via, u, send, payload, tokens)
        if out is True:
            return
        error = out
    if error:
        await send_bytes(send, 502, error)
    else:
        n = len(state.decode.members)
        await send_error(send, 502, f"no working engine ({len(state.decode.healthy())} of {n} healthy)")
