"""One completion request, start to end: conversation -> handle -> verification -> prefill -> decode -> handle.

Used for `/v1/chat/completions` and `/v1/completions` alike (the context's `chat` says which), and for the agent
APIs translated into chat. Its per-request data is on its RequestContext (context.py). The whole request is cancelled
when its client leaves (disconnect.py), and waits for a slot of each pool it uses (admission.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from array import array
from dataclasses import replace
from typing import Any

from starlette.types import Receive, Send

from pdctl.router import decode, placement, prefill, wire
from pdctl.router.admission import RETRY_AFTER_S, Gate, Overloaded
from pdctl.router.capture import Capture
from pdctl.router.context import NOT_TAKEN, RequestContext
from pdctl.router.conversation import Derivation, explicit_id, new_id
from pdctl.router.disconnect import cancel_on_disconnect
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.handles import Handle, Taken
from pdctl.router.state import RouterState
from pdctl.router.upstreams import Pool, Upstream
from pdctl.router.verify import Verdict, as_tokens, hit_params, matching_blocks, miss, verify

log = logging.getLogger("pdctl.router")

_SCOPE_KEY = os.urandom(16)


def _header(headers: list[tuple[bytes, bytes]], names: tuple[bytes, ...]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k in names}


def unsupported(chat: bool, body: dict[str, Any]) -> str | None:
    """Why the router refuses this request before any engine sees it, or None.

    One conversation turn maps to one prefill and one decode: batches.py serves several choices (`n`, `best_of`)
    and prompt lists before this; any that still reach here (another front) are refused rather than half-run.
    """
    if chat and not (isinstance(body.get("messages"), list) and body["messages"]):
        return "`messages` must be a non-empty list"
    if not chat and body.get("prompt") in (None, "", []):
        return "`prompt` is required"
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and value != 1:
            return f"`{name}` must be 1 (got {value!r}): send one request per choice"
    prompt = body.get("prompt")
    if not chat and isinstance(prompt, list) and len(prompt) > 1 and not isinstance(prompt[0], int):
        return f"`prompt` is a list of {len(prompt)} prompts: send one prompt per request"
    return None


def owner(ctx: RequestContext) -> str:
    """Whose conversations these are: the client's credentials (`Authorization`, Anthropic's `x-api-key`) and its
    `cache_salt`. Handles and derived conversations never cross owners, so nobody learns or spends another's KV by
    knowing its conversation id."""
    auth = b"\0".join(v for k, v in ctx.headers if k in (b"authorization", b"x-api-key"))
    salt = ctx.body.get("cache_salt")
    if not auth and salt is None:
        return ""
    mac = hashlib.blake2b(auth + b"\0" + repr(salt).encode(), key=_SCOPE_KEY, digest_size=12)
    return mac.hexdigest()


def _unavailable(pool: Pool) -> str:
    return f"no healthy {pool.role} instance ({len(pool.healthy())} of {len(pool.members)} healthy)"


def conversation(state: RouterState, ctx: RequestContext) -> tuple[str | None, Derivation | None]:
    """The conversation id (None: this request cannot take part in reuse) and, if derived, its derivation."""
    body = ctx.body
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return None, None
    pinned = ctx.conversation
    if pinned is not None:  # already resolved by an agent-API front (a Responses previous_response_id)
        return pinned, None
    who = owner(ctx)
    given = explicit_id(ctx.cid, _header(ctx.headers, (b"x-conversation-id", b"x-session-id")))
    if given is not None:
        return (f"{who}|{given}" if who else given), None
    index = state.index
    d = index.derive_chat(body["messages"], who) if ctx.chat else index.derive_prompt(body["prompt"], who)
    if d.kind == "none":
        return None, None
    return d.cid or new_id(), d


async def _prompt_ids(state: RouterState, ctx: RequestContext, p: Upstream) -> array[int] | None:
    """The prompt's token ids: as sent for a token-id completion, else from the prefill's /tokenize."""
    prompt = ctx.body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    ids = as_tokens(prompt) if not ctx.chat and isinstance(prompt, list) else None
    return ids if ids is not None else await prefill.tokenize(state, ctx, p)


def _verdict(state: RouterState, taken: Taken, ids: array[int] | None) -> Verdict:
    h = taken.handle
    if h is None:
        return miss(taken.reason)
    if not state.config.verify_prefix:
        return Verdict("hit", wire.UNVERIFIED, h.num_tokens, hit_params(h.params))
    if ids is None:
        return miss(wire.TOKENIZE_FAILED)
    return verify(h.params, h.tokens, ids, state.config.block_size, state.config.partial_reuse)


def local_decode(state: RouterState, h: Handle | None, ids: array[int] | None,
                 prefill: Upstream | None = None) -> tuple[Upstream, int] | None:
    """Conditional disaggregation: the decode holding the conversation, and how many of the prompt's tokens its
    prefix cache holds, when it lacks at most `local_prefill_tokens` of them and the placement policy (given the
    decode's and `prefill`'s requests in flight) runs it there; else None (disaggregate)."""
    limit = state.config.local_prefill_tokens
    if limit <= 0 or h is None or ids is None:
        return None
    if state.handles.clock() - h.received > state.config.handle_lifetime / 2:
        return None  # disaggregate this turn: it pins a fresh handle before this one expires (else: a full miss)
    known = h.cached if h.cached is not None else h.tokens
    holder = next((u for u in state.decode.healthy() if u.url == h.decode_url), None)
    if known is None or holder is None:
        return None
    bs = state.config.block_size
    cached = matching_blocks(known, ids, bs) * bs  # vLLM's prefix cache holds whole blocks
    if cached == 0:
        return None
    cfg = state.config
    prefill_load = placement.load_of(prefill) if prefill is not None else None
    if not placement.run_locally(cfg.local_policy, len(ids) - cached, limit, placement.load_of(holder),
                                 prefill_load, cfg.local_busy_streams):
        return None
    return holder, cached


async def completion(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    """Serve one completion request; everything it started upstream is cancelled if its client leaves."""
    if await cancel_on_disconnect(receive, send, lambda out: _completion(state, ctx, receive, out)):
        log.info("[%s] client disconnected; its upstream work was cancelled", ctx.rid)


async def admit(gate: Gate, send: Send, headers: list[tuple[bytes, bytes]] | None = None) -> bool:
    try:
        await gate.acquire()
    except Overloaded as e:
        retry = [(b"retry-after", str(RETRY_AFTER_S).encode()), *(headers or ())]
        await send_error(send, e.status, e.message, retry)
        return False
    return True


async def _completion(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    ctx.started = time.perf_counter()
    problem = unsupported(ctx.chat, ctx.body)
    if problem:
        await send_error(send, 400, problem)
        return
    cid, ctx.derivation = conversation(state, ctx)
    ctx.conversation = cid
    if not state.prefill.healthy() or not state.decode.healthy():
        await send_error(send, 503, _unavailable(state.decode if state.prefill.healthy() else state.prefill))
        return
    if not await admit(state.decode_gate, send):
        return
    ctx.taken = state.handles.take(cid, state.stale) if cid else NOT_TAKEN
    try:
        await _turn(state, ctx, receive, send)
    finally:
        state.decode_gate.release()
        _release(state, ctx)


def _release(state: RouterState, ctx: RequestContext) -> None:
    """Give back the lease on the handle this turn took: the conversation's next turn may take a new one."""
    if not ctx.released and ctx.taken.handle is not None and ctx.conversation is not None:
        ctx.released = True
        state.handles.release(ctx.conversation)


async def _turn(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    rid, cid, taken = ctx.rid, ctx.conversation, ctx.taken
    p = state.prefill_policy.pick(state.prefill, cid or rid)
    if p is None:
        await send_error(send, 503, _unavailable(state.prefill))
        return
    need_ids = taken.handle is not None and state.config.verify_prefix
    ids = await _prompt_ids(state, ctx, p) if need_ids else None
    local = local_decode(state, taken.handle, ids, p)
    if local is not None and ids is not None and await _local_turn(state, ctx, receive, send, local, len(ids)):
        return
    verdict = _verdict(state, taken, ids)
    t0, in_ms = ctx.t0, 0.0
    for attempt in range(2):
        if not await admit(state.prefill_gate, send):
            return
        if attempt == 0:  # the router-in stage: body, conversation, verification, a prefill slot
            in_ms = (time.perf_counter() - t0) * 1000
        work = placement.Work(p, (len(ids) if ids is not None else placement.prompt_tokens(ctx.body)) - verdict.tokens)
        try:
            pre = await prefill.run(state, ctx, p, verdict, ids)
        finally:
            work.done()
            state.prefill_gate.release()
        v = pre.verdict
        if attempt == 0:
            state.metrics.reuse_outcome(v.outcome, v.reason, v.tokens, taken.eligible)
        state.metrics.prefill_seconds.observe(pre.ms / 1000)
        log.info("[%s] Prefill done in %.0fms (kv %s)", rid, pre.ms, v.header)
        headers = [wire.raw_ms(wire.PREFILL_MS_HEADER, pre.ms), v.reuse.raw(),
                   wire.raw_ms(wire.ROUTER_IN_MS_HEADER, in_ms)]
        if pre.status != 200:
            await send_bytes(send, pre.status, pre.error, headers)
            return
        res = await decode.run(state, ctx, receive, send, pre.params, headers, lambda c, d: _keep(state, ctx, c, d))
        if res.sent:
            return
        if not res.redo or attempt == 1:
            if res.error:
                await send_bytes(send, 502, res.error, headers)
            else:
                await send_error(send, 502, _unavailable(state.decode).replace("no healthy", "no working"), headers)
            return
        # The decode could not use this prefill's KV (e.g. the prefill died before the pull): compute it again,
        # on another prefill where there is one. A handle the first prefill read is spent.
        log.warning("[%s] decode could not use the prefill's KV; running the prefill again", rid)
        used = [pre.upstream] if pre.upstream is not None else []
        others = [u for u in state.prefill.healthy() if u not in used]
        nxt = state.prefill_policy.pick(state.prefill, cid or rid, exclude=used if others else [])
        if nxt is None:
            await send_error(send, 503, _unavailable(state.prefill), headers)
            return
        p = nxt
        verdict = miss(wire.PREFILL_REDONE) if verdict.outcome != "miss" else verdict


async def _local_turn(state: RouterState, ctx: RequestContext, receive: Receive, send: Send,
                      local: tuple[Upstream, int], prompt_len: int) -> bool:
    """Run the turn on the decode alone (no kv_transfer_params: an ordinary request that hits its prefix cache).

    The handle stays pinned on the decode for the next disaggregated turn, which reads it and has the prefill
    compute the rest. False when the decode failed before its first byte: the caller then disaggregates.
    """
    taken, rid, derivation = ctx.taken, ctx.rid, ctx.derivation
    d, cached = local
    h = taken.handle
    assert h is not None
    reuse = wire.Reuse("hit", cached, wire.DECODE_LOCAL)
    headers = [wire.raw_ms(wire.PREFILL_MS_HEADER, 0.0), reuse.raw()]

    def keep(capture: Capture, _: Upstream) -> None:
        """The pinned handle goes back for the next turn, with what the decode now caches beyond it."""
        computed = capture.computed_tokens()
        key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation else None
        state.handles.put(replace(h, derived_key=key, cached=as_tokens(computed) if computed else h.cached))
        _release(state, ctx)

    work = placement.Work(d, prompt_len - cached)  # its prompt is a chunk in the decode's batch until the first token
    try:
        res = await decode.run(state, ctx, receive, placement.done_at_first_body(work, send), None, headers, keep,
                               only=d)
    finally:
        work.done()
    if not res.sent:
        log.warning("[%s] local turn: its decode failed before the first byte; disaggregating", rid)
        return False
    state.metrics.reuse_outcome("hit", wire.DECODE_LOCAL, cached, True)
    state.metrics.local_turn()
    log.info("[%s] Ran on the decode alone (kv %s)", rid, reuse.header)
    return True


def _keep(state: RouterState, ctx: RequestContext, capture: Capture, d: Upstream) -> None:
    """Store the decode's new handle for the conversation's next turn, tied to the decode's incarnation, and give
    back the one the turn took: run before the client can see the turn's end (decode.run's `done`)."""
    _release(state, ctx)
    cid = ctx.conversation
    if cid is None:
        return
    if capture.params is None:
        state.handles.mark(cid, wire.NO_HANDLE_RETURNED)
        return
    state.decode.saw_engine(d, capture.params.get("remote_engine_id"))
    derivation = ctx.derivation
    key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation is not None else None
    now = state.handles.clock()
    state.handles.put(Handle(cid, capture.params, d.url, as_tokens(capture.held_tokens()), now,
                             now + state.config.handle_lifetime, key, generation=d.generation))
