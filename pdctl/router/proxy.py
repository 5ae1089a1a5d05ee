"""One completion request, start to end: conversation -> handle -> verification -> prefill -> decode -> handle.

Used for `/v1/chat/completions` and `/v1/completions` alike; `chat` says which.
"""

from __future__ import annotations

import logging
import time
from array import array
from dataclasses import replace
from typing import Any

from starlette.types import Receive, Scope, Send

from pdctl.router import decode, prefill
from pdctl.router.capture import Capture
from pdctl.router.conversation import Derivation, explicit_id, new_id
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.handles import NOT_ELIGIBLE, Handle, Taken
from pdctl.router.state import RouterState
from pdctl.router.upstreams import Pool, Upstream
from pdctl.router.verify import LOCAL_REASON, Verdict, as_tokens, hit_params, matching_blocks, miss, verify

log = logging.getLogger("pdctl.router")


def _header(scope: Scope, names: tuple[bytes, ...]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in names}


def _problem(chat: bool, body: dict[str, Any]) -> str | None:
    if chat and not (isinstance(body.get("messages"), list) and body["messages"]):
        return "`messages` must be a non-empty list"
    if not chat and body.get("prompt") in (None, "", []):
        return "`prompt` is required"
    return None


def _unavailable(pool: Pool) -> str:
    return f"no healthy {pool.role} instance ({len(pool.healthy())} of {len(pool.members)} healthy)"


def conversation(
    state: RouterState, scope: Scope, chat: bool, body: dict[str, Any]
) -> tuple[str | None, Derivation | None]:
    """The conversation id (None: this request cannot take part in reuse) and, if derived, its derivation."""
    if (body.get("n") or 1) != 1 or (body.get("best_of") or 1) != 1:
        return None, None
    pinned = scope.get("pdctl.conversation")
    if isinstance(pinned, str):  # already resolved by an agent-API front (a Responses previous_response_id)
        return pinned, None
    given = explicit_id(scope.get("pdctl.cid"), _header(scope, (b"x-conversation-id", b"x-session-id")))
    if given is not None:
        return given, None
    d = state.index.derive_chat(body["messages"]) if chat else state.index.derive_prompt(body["prompt"])
    if d.kind == "none":
        return None, None
    return d.cid or new_id(), d


async def _prompt_ids(state: RouterState, p: Upstream, chat: bool, body: dict[str, Any]) -> array[int] | None:
    """The prompt's token ids: as sent for a token-id completion, else from the prefill's /tokenize."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    ids = as_tokens(prompt) if not chat and isinstance(prompt, list) else None
    return ids if ids is not None else await prefill.tokenize(state, p, chat, body)


def _verdict(state: RouterState, taken: Taken, ids: array[int] | None) -> Verdict:
    h = taken.handle
    if h is None:
        return miss(taken.reason)
    if not state.config.verify_prefix:
        return Verdict("hit", "unverified", h.num_tokens, hit_params(h.params))
    if ids is None:
        return miss("tokenize_failed")
    return verify(h.params, h.tokens, ids, state.config.block_size, state.config.partial_reuse)


def local_decode(state: RouterState, h: Handle | None, ids: array[int] | None) -> tuple[Upstream, int] | None:
    """Conditional disaggregation: the decode holding the conversation, and how many of the prompt's tokens its
    prefix cache holds, when it lacks at most `local_prefill_tokens` of them; else None (disaggregate)."""
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
    if cached == 0 or len(ids) - cached > limit:
        return None
    return holder, cached


async def completion(state: RouterState, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
    started = time.perf_counter()
    rid: str = scope["pdctl.rid"]
    body: dict[str, Any] = scope["pdctl.body"]
    problem = _problem(chat, body)
    if problem:
        await send_error(send, 400, problem)
        return
    cid, derivation = conversation(state, scope, chat, body)
    scope["pdctl.conversation"] = cid
    p = state.prefill_policy.pick(state.prefill, cid or rid)
    if p is None or not state.decode.healthy():
        await send_error(send, 503, _unavailable(state.prefill if p is None else state.decode))
        return
    taken = state.handles.take(cid) if cid else Taken(None, NOT_ELIGIBLE)
    try:
        need_ids = taken.handle is not None and state.config.verify_prefix
        ids = await _prompt_ids(state, p, chat, body) if need_ids else None
        local = local_decode(state, taken.handle, ids)
        if local is not None and await _local_turn(state, scope, receive, send, rid, chat, body, taken, local,
                                                   derivation, started):
            return
        verdict = _verdict(state, taken, ids)
        pre = await prefill.run(state, p, scope["path"], rid, cid or rid, body, verdict)
        v = pre.verdict
        state.metrics.reuse_outcome(v.outcome, v.reason, v.tokens, taken.eligible)
        state.metrics.prefill_seconds.observe(pre.ms / 1000)
        log.info("[%s] Prefill done in %.0fms (kv %s)", rid, pre.ms, v.header)
        headers = [(b"x-pd-prefill-ms", f"{pre.ms:.1f}".encode()), (b"x-pd-kv-reuse", v.header.encode())]
        if pre.status != 200:
            if pre.status >= 500:
                await send_error(send, 502, pre.error.decode(), headers)
            else:
                await send_bytes(send, pre.status, pre.error, headers)
            return
        holder = taken.handle.decode_url if taken.handle is not None else ""
        res = await decode.run(state, receive, send, scope["path"], rid, chat, body, pre.params, holder, headers,
                               started)
        if not res.sent:
            await send_error(send, 502, _unavailable(state.decode).replace("no healthy", "no working"), headers)
            return
        if cid is not None and res.capture is not None and res.upstream is not None:
            _keep(state, cid, derivation, res.capture, res.upstream.url)
    finally:
        if taken.handle is not None and cid is not None:
            state.handles.release(cid)


async def _local_turn(
    state: RouterState, scope: Scope, receive: Receive, send: Send, rid: str, chat: bool,
    body: dict[str, Any], taken: Taken, local: tuple[Upstream, int], derivation: Derivation | None, started: float,
) -> bool:
    """Run the turn on the decode alone (no kv_transfer_params: an ordinary request that hits its prefix cache).

    The handle stays pinned on the decode for the next disaggregated turn, which reads it and has the prefill
    compute the rest. False when the decode failed before its first byte: the caller then disaggregates.
    """
    d, cached = local
    h = taken.handle
    assert h is not None
    header = f"hit;tokens={cached};reason={LOCAL_REASON}"
    headers = [(b"x-pd-prefill-ms", b"0.0"), (b"x-pd-kv-reuse", header.encode())]
    res = await decode.run(state, receive, send, scope["path"], rid, chat, body, None, h.decode_url, headers,
                           started, only=d)
    if not res.sent:
        log.warning("[%s] local turn: its decode failed before the first byte; disaggregating", rid)
        return False
    state.metrics.reuse_outcome("hit", LOCAL_REASON, cached, True)
    state.metrics.local_turn()
    log.info("[%s] Ran on the decode alone (kv %s)", rid, header)
    capture = res.capture
    computed = capture.computed_tokens() if capture is not None else None
    key = derivation.reply_key(capture.reply(), capture.output_ids) if capture and derivation else None
    # The pinned handle goes back for the next turn, with what the decode now caches beyond it.
    state.handles.put(replace(h, derived_key=key, cached=as_tokens(computed) if computed else h.cached))
    return True


def _keep(state: RouterState, cid: str, derivation: Derivation | None, capture: Capture, decode_url: str) -> None:
    """Store the decode's new handle for the conversation's next turn."""
    if capture.params is None:
        state.handles.mark(cid, "no_handle_returned")
        return
    key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation is not None else None
    now = state.handles.clock()
    state.handles.put(Handle(cid, capture.params, decode_url, as_tokens(capture.held_tokens()), now,
                             now + state.config.handle_lifetime, key))
