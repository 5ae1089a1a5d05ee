"""One completion request, start to end: conversation -> handle -> verification -> prefill -> decode -> handle.

Used for `/v1/chat/completions` and `/v1/completions` alike; `chat` says which. The whole request is cancelled
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

from starlette.types import Receive, Scope, Send

from pdctl.router import decode, placement, prefill
from pdctl.router.admission import RETRY_AFTER_S, Gate, Overloaded
from pdctl.router.capture import Capture
from pdctl.router.conversation import Derivation, explicit_id, new_id
from pdctl.router.disconnect import cancel_on_disconnect
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.handles import NOT_ELIGIBLE, Handle, Taken
from pdctl.router.state import RouterState
from pdctl.router.upstreams import Pool, Upstream
from pdctl.router.verify import LOCAL_REASON, Verdict, as_tokens, hit_params, matching_blocks, miss, verify

log = logging.getLogger("pdctl.router")

_SCOPE_KEY = os.urandom(16)


def _header(scope: Scope, names: tuple[bytes, ...]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in names}


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


def owner(scope: Scope, body: dict[str, Any]) -> str:
    """Whose conversations these are: the client's credentials (`Authorization`, Anthropic's `x-api-key`) and its
    `cache_salt`. Handles and derived conversations never cross owners, so nobody learns or spends another's KV by
    knowing its conversation id."""
    auth = b"\0".join(v for k, v in scope["headers"] if k in (b"authorization", b"x-api-key"))
    salt = body.get("cache_salt")
    if not auth and salt is None:
        return ""
    mac = hashlib.blake2b(auth + b"\0" + repr(salt).encode(), key=_SCOPE_KEY, digest_size=12)
    return mac.hexdigest()


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
    who = owner(scope, body)
    given = explicit_id(scope.get("pdctl.cid"), _header(scope, (b"x-conversation-id", b"x-session-id")))
    if given is not None:
        return (f"{who}|{given}" if who else given), None
    index = state.index
    d = index.derive_chat(body["messages"], who) if chat else index.derive_prompt(body["prompt"], who)
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


async def completion(state: RouterState, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
    """Serve one completion request; everything it started upstream is cancelled if its client leaves."""
    if await cancel_on_disconnect(receive, send, lambda out: _completion(state, scope, receive, out, chat)):
        log.info("[%s] client disconnected; its upstream work was cancelled", scope.get("pdctl.rid", "-"))


async def admit(gate: Gate, send: Send, headers: list[tuple[bytes, bytes]] | None = None) -> bool:
    try:
        await gate.acquire()
    except Overloaded as e:
        retry = [(b"retry-after", str(RETRY_AFTER_S).encode()), *(headers or ())]
        await send_error(send, e.status, e.message, retry)
        return False
    return True


async def _completion(state: RouterState, scope: Scope, receive: Receive, send: Send, chat: bool) -> None:
    started = time.perf_counter()
    rid: str = scope["pdctl.rid"]
    body: dict[str, Any] = scope["pdctl.body"]
    problem = unsupported(chat, body)
    if problem:
        await send_error(send, 400, problem)
        return
    cid, derivation = conversation(state, scope, chat, body)
    scope["pdctl.conversation"] = cid
    if not state.prefill.healthy() or not state.decode.healthy():
        await send_error(send, 503, _unavailable(state.decode if state.prefill.healthy() else state.prefill))
        return
    if not await admit(state.decode_gate, send):
        return
    taken = state.handles.take(cid, state.stale) if cid else Taken(None, NOT_ELIGIBLE)
    try:
        await _turn(state, scope, receive, send, rid, chat, body, cid, derivation, taken, started)
    finally:
        state.decode_gate.release()
        if taken.handle is not None and cid is not None:
            state.handles.release(cid)


async def _turn(
    state: RouterState, scope: Scope, receive: Receive, send: Send, rid: str, chat: bool, body: dict[str, Any],
    cid: str | None, derivation: Derivation | None, taken: Taken, started: float,
) -> None:
    p = state.prefill_policy.pick(state.prefill, cid or rid)
    if p is None:
        await send_error(send, 503, _unavailable(state.prefill))
        return
    need_ids = taken.handle is not None and state.config.verify_prefix
    ids = await _prompt_ids(state, p, chat, body) if need_ids else None
    local = local_decode(state, taken.handle, ids, p)
    if local is not None and ids is not None and await _local_turn(state, scope, receive, send, rid, chat, body,
                                                                   taken, local, len(ids), derivation, started):
        return
    verdict = _verdict(state, taken, ids)
    t0, in_ms = scope.get("pdctl.t0", started), 0.0
    for attempt in range(2):
        if not await admit(state.prefill_gate, send):
            return
        if attempt == 0:  # the router-in stage: body, conversation, verification, a prefill slot
            in_ms = (time.perf_counter() - t0) * 1000
        work = placement.Work(p, (len(ids) if ids is not None else placement.prompt_tokens(body)) - verdict.tokens)
        try:
            pre = await prefill.run(state, p, scope["path"], rid, cid or rid, body, verdict, ids)
        finally:
            work.done()
            state.prefill_gate.release()
        v = pre.verdict
        if attempt == 0:
            state.metrics.reuse_outcome(v.outcome, v.reason, v.tokens, taken.eligible)
        state.metrics.prefill_seconds.observe(pre.ms / 1000)
        log.info("[%s] Prefill done in %.0fms (kv %s)", rid, pre.ms, v.header)
        headers = [(b"x-pd-prefill-ms", f"{pre.ms:.1f}".encode()), (b"x-pd-kv-reuse", v.header.encode()),
                   (b"x-pd-router-in-ms", f"{in_ms:.1f}".encode())]
        if pre.status != 200:
            await send_bytes(send, pre.status, pre.error, headers)
            return
        holder = taken.handle.decode_url if taken.handle is not None else ""
        res = await decode.run(state, receive, send, scope["path"], rid, chat, body, pre.params, holder, headers,
                               started)
        if res.sent:
            if cid is not None and res.capture is not None and res.upstream is not None:
                _keep(state, cid, derivation, res.capture, res.upstream)
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
        verdict = miss("prefill_redone") if verdict.outcome != "miss" else verdict


async def _local_turn(
    state: RouterState, scope: Scope, receive: Receive, send: Send, rid: str, chat: bool,
    body: dict[str, Any], taken: Taken, local: tuple[Upstream, int], prompt_len: int, derivation: Derivation | None,
    started: float,
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
    work = placement.Work(d, prompt_len - cached)  # its prompt is a chunk in the decode's batch until the first token
    try:
        res = await decode.run(state, receive, placement.done_at_first_body(work, send), scope["path"], rid, chat,
                               body, None, h.decode_url, headers, started, only=d)
    finally:
        work.done()
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


def _keep(state: RouterState, cid: str, derivation: Derivation | None, capture: Capture, d: Upstream) -> None:
    """Store the decode's new handle for the conversation's next turn, tied to the decode's incarnation."""
    if capture.params is None:
        state.handles.mark(cid, "no_handle_returned")
        return
    state.decode.saw_engine(d, capture.params.get("remote_engine_id"))
    key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation is not None else None
    now = state.handles.clock()
    state.handles.put(Handle(cid, capture.params, d.url, as_tokens(capture.held_tokens()), now,
                             now + state.config.handle_lifetime, key, generation=d.generation))
