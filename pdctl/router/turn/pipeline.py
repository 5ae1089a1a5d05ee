"""One completion request, start to end: conversation -> handle -> local or verification -> prefill -> decode ->
handle.

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
from typing import Any

from starlette.types import Receive, Send

from pdctl import prefix_check
from pdctl.router import wire
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.kv.conversation import Derivation, explicit_id, new_id
from pdctl.router.kv.handles import UNREAD, Handle
from pdctl.router.turn import decode, local, overflow, placement, prefill
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import NOT_TAKEN, RequestContext
from pdctl.router.turn.disconnect import cancel_on_disconnect
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.verify import Verdict, as_tokens, at_prefill, hit_params, miss, verify
from pdctl.router.upstream.admission import RETRY_AFTER_S, Gate, Overloaded
from pdctl.router.upstream.pools import Pool, Upstream

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


async def _verdict(state: RouterState, ctx: RequestContext, p: Upstream) -> tuple[Verdict, array[int] | None]:
    """What the turn does with its handle, and the prompt's ids when the router has them (it then verified).

    verify_at prefill: the prefill verifies (text and chat: nothing on the way there); token-id prompts are
    compared here, which costs no tokenizer. verify_at router: the prefill's /tokenize, then the comparison."""
    h = ctx.taken.handle
    if h is None:
        return miss(ctx.taken.reason), None
    cfg = state.config
    if not cfg.verify_prefix:
        return Verdict("hit", wire.UNVERIFIED, h.num_tokens, hit_params(h.params)), None
    ids = local.token_ids(ctx)
    if ids is None and cfg.verify_at == "prefill":
        return at_prefill(h.params, h.spec), None
    if ids is None:
        ids = await prefill.tokenize(state, ctx, p)
    if ids is None:
        return miss(wire.TOKENIZE_FAILED), None
    return verify(h.params, h.tokens, ids, cfg.block_size, cfg.partial_reuse), ids


def _new_tokens(ctx: RequestContext, ids: array[int] | None, verdict: Verdict) -> int:
    """The prompt tokens the prefill computes (placement's load): exact with ids, else what the request adds to the
    handle's history (pdctl.router.local's bound) or, with nothing to relate it to, its size less the reuse."""
    if ids is not None:
        return len(ids) - verdict.tokens
    h = ctx.taken.handle
    added = local.added_tokens(ctx, h.history) if h is not None and verdict.outcome != "miss" else None
    return added if added is not None else placement.prompt_tokens(ctx.body) - verdict.tokens


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
    whole = overflow.choose(state, ctx)
    if whole is not None:
        if not await admit(state.prefill_gate, send):
            return
        try:
            if await overflow.run(state, ctx, send, whole):
                return
        finally:
            state.prefill_gate.release()
    if not await admit(state.decode_gate, send):
        return
    ctx.taken = state.handles.take(cid, state.stale) if cid else NOT_TAKEN
    try:
        await _turn(state, ctx, receive, send)
    finally:
        state.decode_gate.release()
        ctx.release(state.handles)
        _release_unread(state, ctx)


def _release_unread(state: RouterState, ctx: RequestContext) -> None:
    """The turn took a handle that no prefill got (a miss decided here, a failure, the client left) and that is
    not back in the table (a local turn puts it back): its blocks would stay pinned until the decode's TTL."""
    h = ctx.taken.handle
    if h is None or ctx.spent or ctx.conversation is None:
        return
    now = state.handles.get(ctx.conversation)
    if now is None or now.request_id != h.request_id:
        state.releaser.submit(h, UNREAD)


async def _turn(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    rid, cid, taken = ctx.rid, ctx.conversation, ctx.taken
    p = state.prefill_policy.pick(state.prefill, cid or rid)
    if p is None:
        await send_error(send, 503, _unavailable(state.prefill))
        return
    here = local.decide(state, ctx, taken.handle, p)
    if here is not None and await local.run(state, ctx, receive, send, here):
        return
    verdict, ids = await _verdict(state, ctx, p)
    t0, in_ms = ctx.t0, 0.0
    for attempt in range(2):
        if not await admit(state.prefill_gate, send):
            return
        if attempt == 0:  # the router-in stage: body, conversation, verification, a prefill slot
            in_ms = (time.perf_counter() - t0) * 1000
        work = placement.Work(p, _new_tokens(ctx, ids, verdict))
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
        verdict = miss(wire.PREFILL_REDONE) if v.outcome != "miss" else v


def _keep(state: RouterState, ctx: RequestContext, capture: Capture, d: Upstream) -> None:
    """Store the decode's new handle for the conversation's next turn, tied to the decode's incarnation, and give
    back the one the turn took: run before the client can see the turn's end (decode.run's `done`)."""
    ctx.release(state.handles)
    cid = ctx.conversation
    if cid is None:
        return
    if capture.params is None:
        state.handles.mark(cid, wire.NO_HANDLE_RETURNED)
        return
    state.decode.saw_engine(d, capture.params.get("remote_engine_id"))
    derivation = ctx.derivation
    key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation is not None else None
    now, cfg = state.handles.clock(), state.config
    held = as_tokens(capture.held_tokens())
    n = capture.params.get("remote_num_tokens")
    spec = (prefix_check.spec(held, n, cfg.block_size, cfg.partial_reuse)
            if cfg.verify_prefix and cfg.verify_at == "prefill" and held is not None and isinstance(n, int) and n > 0
            else None)
    state.handles.put(Handle(cid, capture.params, d.url, held, now, now + cfg.handle_lifetime, key,
                             generation=d.generation, spec=spec, history=local.history(ctx, capture)))
