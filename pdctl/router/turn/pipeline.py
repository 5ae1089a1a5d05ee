"""One conversation turn, start to end, read top to bottom in `_turn`: each stage called once, in order, its
decision a value the next one takes.

    request       refuse what one turn cannot be; whose conversation it is              request.py
    placement     whole on a prefill (router.overflow_kv)?                               overflow.py
    handle        the conversation's decode handle, taken for this turn                  kv/handles.py
    placement     on the decode that holds it, alone (conditional disaggregation)?      local.py
    verification  what the turn does with the handle: hit, partial, miss                 verification.py
    prefill hop   the prefill reads what it lacks from the decode, computes the rest    prefill.py
    decode hop    the decode pulls the prefill's KV and streams the answer              decode.py
    keep          the decode's new handle, kept before the client sees the end          keep.py
A decode that could not use the prefill's KV (the prefill died before the pull) is the one retry: the prefill hop
again, as a recompute, on another prefill where there is one.

Used for `/v1/chat/completions` and `/v1/completions` alike (the context's `chat` says which), and for the agent
APIs translated into chat; aggregated mode runs `aggregated.completion` instead. The whole turn is cancelled when
its client leaves (disconnect.py), and waits for a slot of each pool it uses (upstream/admission.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

from starlette.types import Receive, Send

from pdctl.router import wire
from pdctl.router.errors import send_bytes, send_error
from pdctl.router.kv.conversation import first_turn
from pdctl.router.kv.handles import Taken
from pdctl.router.turn import (
    aggregated,
    choices,
    decode,
    keep,
    local,
    measure,
    overflow,
    prefill,
    request,
    verification,
)
from pdctl.router.turn.context import NOT_TAKEN, RequestContext
from pdctl.router.turn.disconnect import cancel_on_disconnect
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.trace import CLIENT, Trace
from pdctl.router.turn.verify import Verdict, offered_tokens
from pdctl.router.upstream import load
from pdctl.router.upstream.pools import Upstream

log = logging.getLogger("pdctl.router")
RESTARTED = "restarted"  # the release reason of a handle whose conversation started again from its first turn


async def completion(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    """Serve one conversation turn in the router's mode; everything it started upstream is cancelled if its client
    leaves. With tracing on, the turn is one trace (turn/trace.py), queued for export once the response ended."""
    tracer = state.tracer
    tr = None
    if tracer is not None and ctx.trace is None:
        route = ctx.route.path if ctx.route is not None else ctx.path
        tr = tracer.begin(ctx.headers, ctx.t0, ctx.method, route, ctx.rid)
        if tr is not None:
            ctx.trace, send = tr, tr.watch(send)
    try:
        if state.config.mode == "aggregated":
            await aggregated.completion(state, ctx, receive, send)
        elif await cancel_on_disconnect(receive, send, lambda out: _turn(state, ctx, receive, out)):
            log.info("[%s] client disconnected; its upstream work was cancelled", ctx.rid)
    finally:
        if tracer is not None and tr is not None:
            tracer.finish(tr, time.perf_counter())


async def _turn(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    ctx.started = time.perf_counter()
    problem = request.resolve(state, ctx)
    if problem:
        await send_error(send, 400, problem)
        return
    if not state.prefill.healthy() or not state.decode.healthy():
        await send_error(send, 503, request.unavailable(state.decode if state.prefill.healthy() else state.prefill))
        return
    whole = overflow.choose(state, ctx)
    if whole is not None and await _whole_on_prefill(state, ctx, send, whole):
        return
    if not await state.decode_gate.admit(send):
        return
    ctx.taken = _take(state, ctx)
    try:
        p = state.prefill_policy.pick(state.prefill, ctx.conversation or ctx.rid)
        if p is None:
            await send_error(send, 503, request.unavailable(state.prefill))
            return
        here = local.decide(state, ctx, ctx.taken.handle, p)
        if here is not None and await _on_decode(state, ctx, receive, send, here):
            return
        verifying = time.perf_counter()
        hop: _Hop | None = _Hop(p, await verification.check(state, ctx, p))
        if ctx.trace is not None:
            ctx.trace.span("verification", verifying, time.perf_counter(),
                           {"pdctl.verify_at": state.config.verify_at})
        while hop is not None:
            hop = await _hops(state, ctx, receive, send, hop)
    finally:
        state.decode_gate.release()
        ctx.release(state.handles)
        keep.release_unread(state, ctx)


def _take(state: RouterState, ctx: RequestContext) -> Taken:
    """The conversation's handle for this turn. A chat that starts again from its first turn (a replayed trace, a
    client reusing its session id) is a new conversation, not a warm turn that missed: its old handle is released."""
    cid = ctx.conversation
    if cid is None:
        return NOT_TAKEN
    if ctx.chat and first_turn(ctx.body.get("messages")):
        state.handles.drop(cid, RESTARTED, wire.NEW_CONVERSATION)
        return Taken(None, wire.NEW_CONVERSATION)
    return state.handles.take(cid, state.stale)


async def _whole_on_prefill(state: RouterState, ctx: RequestContext, send: Send, p: Upstream) -> bool:
    """The turn whole on prefill `p`; True when it ended there (served, or refused a slot)."""
    if not await state.prefill_gate.admit(send):
        return True
    try:
        return await overflow.run(state, ctx, send, p)
    finally:
        state.prefill_gate.release()


async def _on_decode(state: RouterState, ctx: RequestContext, receive: Receive, send: Send,
                     here: local.Local) -> bool:
    """The turn on its decode alone: no kv_transfer_params, an ordinary request that hits the decode's prefix cache.

    The handle stays pinned on the decode for the next disaggregated turn, which reads it and has the prefill
    compute the rest. False when the decode failed before its first byte: the turn then disaggregates."""
    h = ctx.taken.handle
    assert h is not None
    reuse = wire.Reuse("hit", here.held, wire.DECODE_LOCAL)
    headers = [wire.raw_ms(wire.PREFILL_MS_HEADER, 0.0), reuse.raw()]
    if ctx.choice is not None:
        headers.append(choices.header(ctx.choice))
    ahead = here.decode.work
    work = load.Work(here.decode, here.missing)  # a chunk in the decode's batch until the first token
    ctx.cached_tokens, ctx.cached_default = None, here.held  # the decode's own report, where it makes one
    try:
        res = await decode.run(state, ctx, receive, load.done_at_first_body(work, send), None, headers,
                               partial(keep.same_handle, state, ctx, h), only=here.decode)
    finally:
        work.done()
    if not res.sent:
        log.warning("[%s] local turn: its decode failed before the first byte; disaggregating", ctx.rid)
        return False
    state.metrics.reuse_outcome("hit", wire.DECODE_LOCAL, here.held, True)
    state.metrics.local_turn()
    prompt = res.capture.prompt_ids if res.capture is not None else None  # exact, where the estimate bounds
    missing = len(prompt) - here.held if prompt else here.missing
    measure.local_turn(state, ctx, here.decode, here.held + missing, ahead, missing)
    measure.chosen(state, ctx)
    if ctx.trace is not None:
        ctx.trace.outcome(reuse, ctx.conversation)
    log.info("[%s] Ran on the decode alone (kv %s)", ctx.rid, reuse.header)
    return True


def _trace_hop(tr: Trace, ctx: RequestContext, pre: prefill.PrefillResult, span: bytes, in_ms: float | None,
               offered: int | None) -> None:
    """The turn's router-in stage (first hop), the prefill hop and the D->P read inside it, as spans."""
    v = pre.verdict
    if in_ms is not None:
        tr.outcome(v.reuse, ctx.conversation)
        tr.span("router_in", ctx.t0, ctx.t0 + in_ms / 1000)
    end = time.perf_counter()
    start = end - pre.ms / 1000
    url = pre.upstream.url if pre.upstream is not None else ""
    tr.span("prefill", start, end, kind=CLIENT, span_id=span, error=pre.status != 200,
            attrs={"server.address": url, "http.response.status_code": pre.status, "pdctl.kv.outcome": v.outcome,
               "pdctl.kv.reason": v.reason, "pdctl.prompt.offered_tokens": offered or 0})
    if read_tokens(v):
        tr.span("kv.read d->p", start, end, parent=span,
                attrs={"pdctl.kv.tokens": read_tokens(v), "pdctl.kv.direction": wire.D_TO_P,
                       "pdctl.timing": "the prefill hop"})


def read_tokens(v: Verdict) -> int:
    """The tokens the prefill read from the decode (D->P): what it reported reading, else (verified at the router,
    or unverified) the verdict's tokens of a read; none when its own prefix cache held the history."""
    if v.read is not None:
        return v.read
    return v.tokens if v.reuse.source == wire.DECODE_READ else 0


@dataclass(frozen=True)
class _Hop:
    """A prefill hop to run: on `p`, with `check`'s verdict; `in_ms` is the router-in stage once measured (None
    before the first hop: body, conversation, verification, a prefill slot)."""

    p: Upstream
    check: verification.Check
    in_ms: float | None = None


async def _hops(state: RouterState, ctx: RequestContext, receive: Receive, send: Send, hop: _Hop) -> _Hop | None:
    """The prefill hop then the decode hop; the hop to run again when the decode could not use this prefill's KV
    (once), else None: the client has its answer or its error."""
    first = hop.in_ms is None
    if not await state.prefill_gate.admit(send):
        return None
    in_ms = (time.perf_counter() - ctx.t0) * 1000 if hop.in_ms is None else hop.in_ms
    check, p = hop.check, hop.p
    tr = ctx.trace
    span = tr.new_id() if tr is not None else None  # the prefill request's traceparent names its span
    ahead = p.work
    work = load.Work(p, check.new_tokens)
    try:
        pre = await prefill.run(state, ctx, p, check.verdict, check.ids, span)
    finally:
        work.done()
        state.prefill_gate.release()
    v = pre.verdict
    r = v.reuse  # with the prefill's cached figure; built directly (dataclasses.replace costs several times more)
    reuse = wire.Reuse(r.outcome, tokens=r.tokens, reason=r.reason, read=r.read, block=r.block, cached=pre.cached)
    offered = offered_tokens(pre.params, state.config.block_size)
    if first:
        state.metrics.reuse_outcome(v.outcome, v.reason, v.tokens, ctx.taken.eligible, v.read, pre.cached)
        if v.block is not None:
            state.metrics.diverged_at(v.block * state.config.block_size)
    if pre.status == 200:
        state.metrics.moved(read_tokens(v), offered)
        if pre.upstream is not None:
            computed = check.all_tokens - (pre.cached if pre.cached is not None else v.tokens)
            measure.prefill_hop(state, pre.upstream, ctx.holder, check.all_tokens, ahead, computed, read_tokens(v),
                                pre.ms / 1000)
    state.metrics.prefill_seconds.observe(pre.ms / 1000)
    if tr is not None and span is not None:
        _trace_hop(tr, ctx, pre, span, in_ms if first else None, offered)
    log.info("[%s] Prefill done in %.0fms (kv %s)", ctx.rid, pre.ms, v.header)
    headers = [wire.raw_ms(wire.PREFILL_MS_HEADER, pre.ms), reuse.raw(), wire.raw_ms(wire.ROUTER_IN_MS_HEADER, in_ms)]
    if ctx.choice is not None:
        headers.append(choices.header(ctx.choice))
    if pre.status != 200:
        await send_bytes(send, pre.status, pre.error, headers)
        return None
    ctx.cached_tokens, ctx.cached_default = pre.cached, v.tokens
    res = await decode.run(state, ctx, receive, send, pre.params, headers, partial(keep.new_handle, state, ctx))
    if res.sent:
        measure.pulled(state, ctx, pre.upstream, res.upstream, offered)
        measure.chosen(state, ctx)
        return None
    if not res.redo or not first:
        if res.error:
            await send_bytes(send, 502, res.error, headers)
        else:
            await send_error(send, 502, request.unavailable(state.decode).replace("no healthy", "no working"), headers)
        return None
    # The decode could not use this prefill's KV (e.g. the prefill died before the pull): compute it again, on
    # another prefill where there is one. A handle the first prefill read is spent.
    log.warning("[%s] decode could not use the prefill's KV; running the prefill again", ctx.rid)
    used = [pre.upstream] if pre.upstream is not None else []
    others = [u for u in state.prefill.healthy() if u not in used]
    nxt = state.prefill_policy.pick(state.prefill, ctx.conversation or ctx.rid, exclude=used if others else [])
    if nxt is None:
        await send_error(send, 503, request.unavailable(state.prefill), headers)
        return None
    return _Hop(nxt, check.redone(v), in_ms)
