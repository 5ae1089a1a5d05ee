"""Overflow to the prefill ("whole on the prefill"): a turn whose decode is short of KV runs whole on a prefill.

With one decode, every live conversation's context sits in that decode's KV while the prefill's KV and compute
stay mostly idle (docs/results/sim-capacity). A prefill engine (kv_role kv_both, prefix caching) serves a plain
completion as an aggregated engine does: no kv_transfer_params, no P->D handoff. So when the decode a turn would
use is above `router.overflow_kv` of its KV (with this turn's tokens) and a prefill is below it, the turn goes
whole to the least used such prefill, through the forwarding aggregated mode uses (whole.py), and the
conversation's later turns follow it there (its prompt is in that prefill's prefix cache) while that prefill
stays below the threshold. The price: decode steps on the prefill lengthen the prefill hop of other turns.

The KV use is kv/usage.py's (polled, plus what was sent since): the decision adds no HTTP call to a turn. A
conversation that moves to a prefill gives up its decode handle (released, reason `overflow`); one whose prefill
fails before the first byte goes the normal way through the decode.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.types import Send

from pdctl.router import jsonx, wire
from pdctl.router.kv.affinity import Served
from pdctl.router.turn import placement, whole
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Upstream

log = logging.getLogger("pdctl.router")

OVERFLOW = "overflow"  # why a handle was released: its conversation moved whole to a prefill


def whole_on_prefill(threshold: float | None, decode_use: float | None,
                     prefills: Sequence[tuple[Upstream, float | None]], current: Upstream | None = None
                     ) -> Upstream | None:
    """The prefill to serve this turn whole on, or None (the normal path through the decode).

    `decode_use` is the KV use of the decode the turn would use with the turn's tokens; `prefills` the healthy
    prefills with their KV use; `current` the prefill the conversation's last turn ran whole on, if any. 0 or None
    turns overflow off; an unknown use never overflows."""
    if not threshold:
        return None
    below = [(u, use) for u, use in prefills if use is not None and use < threshold]
    if current is not None and any(u is current for u, _ in below):
        return current
    if decode_use is None or decode_use <= threshold or not below:
        return None
    return min(below, key=lambda b: (b[1], b[0].outstanding))[0]


def turn_tokens(ctx: RequestContext) -> int:
    """The KV a turn adds where it runs: its prompt (placement's estimate) and at most its answer."""
    body = ctx.body
    out = body.get("max_completion_tokens", body.get("max_tokens"))
    return placement.prompt_tokens(body) + (out if isinstance(out, int) and out > 0 else 0)


def _current(state: RouterState, served: Served | None) -> Upstream | None:
    if served is None:
        return None
    u = state.prefill.by_url(served.url)
    return u if u is not None and u.healthy and u.generation == served.generation else None


def _decode(state: RouterState, ctx: RequestContext) -> Upstream | None:
    """The decode this turn would use: the one holding its handle, else the least used healthy one."""
    healthy = state.decode.healthy()
    h = state.handles.get(ctx.conversation) if ctx.conversation is not None else None
    holder = next((u for u in healthy if h is not None and u.url == h.decode_url), None)
    if holder is not None or not healthy:
        return holder
    return min(healthy, key=lambda u: (state.kv_use.use(u) or 0.0, u.outstanding))


def choose(state: RouterState, ctx: RequestContext) -> Upstream | None:
    """Where this turn runs whole, or None; counts the turn's tokens on the decode when it stays on the decode."""
    threshold = state.config.overflow_kv
    if not threshold:
        return None
    cid = ctx.conversation
    served = state.overflowed.get(cid) if cid is not None else None
    tokens = turn_tokens(ctx)
    d = _decode(state, ctx)
    decode_use = state.kv_use.use(d, tokens) if d is not None else None
    prefills = [(u, state.kv_use.use(u)) for u in state.prefill.healthy()]
    p = whole_on_prefill(threshold, decode_use, prefills, _current(state, served))
    if p is None:
        if d is not None:
            state.kv_use.sent(d, tokens)
        if cid is not None and served is not None:
            state.overflowed.drop(cid)  # back through the decode: the handle table follows it from here
    return p


async def run(state: RouterState, ctx: RequestContext, send: Send, p: Upstream) -> bool:
    """Serve the turn whole on prefill `p`; False when `p` failed before the first byte (nothing was sent)."""
    cid = ctx.conversation
    current = _current(state, state.overflowed.get(cid)) if cid is not None else None
    reuse = wire.Reuse("hit" if current is p else "miss", 0, wire.WHOLE_PREFILL)
    eligible = current is p or (cid is not None and state.handles.get(cid) is not None)
    state.kv_use.sent(p, turn_tokens(ctx))
    via = whole.Via(state.prefill, state.overflowed, (reuse.raw(),))
    out = await whole.attempt(state, ctx, via, p, send, jsonx.dumps(ctx.body), placement.prompt_tokens(ctx.body))
    if out is not True:
        log.warning("[%s] prefill %s could not serve the turn whole; through the decode instead", ctx.rid, p.url)
        return False
    state.metrics.whole_prefill_turn(reuse.outcome, eligible)
    if ctx.trace is not None:
        ctx.trace.outcome(reuse, cid)
    if cid is not None and state.handles.drop(cid, OVERFLOW, wire.WHOLE_PREFILL):
        log.info("[%s] conversation moved whole to prefill %s; its decode handle is released", ctx.rid, p.url)
    log.info("[%s] Served whole on prefill %s (kv %s)", ctx.rid, p.url, reuse.header)
    return True
