"""The turn's last stage: the decode's answer becomes the conversation's next handle, before the client can see
the turn's end (decode.run's `done`), so a client that sends its next turn at once finds it kept.

A disaggregated turn keeps the decode's new handle, tied to that decode's incarnation, with the tokens it holds
and the digests a prefill verifies them by. A local turn puts back the handle it took, with what the decode now
caches beyond it. Either way the lease the turn took is given back; a handle no prefill read and that is not back
in the table is released on its decode (`release_unread`), else its blocks stay pinned until the decode's TTL.
"""

from __future__ import annotations

from dataclasses import replace

from pdctl import prefix_check
from pdctl.router import wire
from pdctl.router.kv.handles import PRESSURE, SINGLE_TURN, UNREAD, Handle
from pdctl.router.kv.retention import single_turn
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.history import history
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.verify import as_tokens
from pdctl.router.upstream.pools import Upstream


def new_handle(state: RouterState, ctx: RequestContext, capture: Capture, d: Upstream) -> None:
    """A disaggregated turn's decode answer is whole: store the decode's new handle."""
    ctx.release(state.handles)
    cid = ctx.conversation
    if capture.params is not None and (cid is None or single_turn(ctx.headers)):
        # Nothing continues it (no conversation), or the client says nothing will: the decode keeps nothing.
        now = state.handles.clock()
        state.releaser.submit(Handle(cid or "", capture.params, d.url, None, now, now, generation=d.generation),
                              SINGLE_TURN)
        if cid is not None:
            state.handles.mark(cid, wire.RELEASED)
        return
    if cid is None:
        return
    derivation = ctx.derivation
    key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation is not None else None
    if capture.params is None:  # its next turn is warm all the same, found by its key where it has no id
        state.handles.mark(cid, wire.NO_HANDLE_RETURNED, key)
        return
    state.decode.saw_engine(d, capture.params.get("remote_engine_id"))
    now, cfg = state.handles.clock(), state.config
    if state.retention.squeezed(d.url) and not state.handles.continues(cid):
        # Requests wait for KV on that decode: a first turn's blocks go back now, one release per new conversation
        # (which the next one's prefill request carries), not in a poll's batch, most of which would go alone. Its
        # next turn, if one comes, misses (`released`) and is kept from then on.
        state.releaser.submit(Handle(cid, capture.params, d.url, None, now, now, generation=d.generation), PRESSURE)
        state.handles.mark(cid, wire.RELEASED, key)
        return
    held = as_tokens(capture.held_tokens())
    n = capture.params.get("remote_num_tokens")
    spec = (prefix_check.spec(held, n, cfg.block_size, cfg.partial_reuse, cfg.min_read_tokens)
            if cfg.verify_prefix and cfg.verify_at == "prefill" and held is not None and isinstance(n, int)
            and n > 0 else None)
    state.handles.put(Handle(cid, capture.params, d.url, held, now, now + cfg.handle_lifetime, key,
                             generation=d.generation, spec=spec, history=history(ctx, capture)))


def same_handle(state: RouterState, ctx: RequestContext, h: Handle, capture: Capture, _: Upstream) -> None:
    """A local turn's decode answer is whole: the pinned handle goes back for the next turn, with what the decode
    now caches beyond it."""
    computed = capture.computed_tokens()
    derivation = ctx.derivation
    key = derivation.reply_key(capture.reply(), capture.output_ids) if derivation else None
    state.handles.put(replace(h, derived_key=key, cached=as_tokens(computed) if computed else h.cached,
                              history=history(ctx, capture)))
    ctx.release(state.handles)


def release_unread(state: RouterState, ctx: RequestContext) -> None:
    """The turn took a handle that no prefill got (a miss decided here, a failure, the client left) and that is
    not back in the table (a local turn puts it back): release its blocks on the decode."""
    h = ctx.taken.handle
    if h is None or ctx.spent or ctx.conversation is None:
        return
    now = state.handles.get(ctx.conversation)
    if now is None or now.request_id != h.request_id:
        state.releaser.submit(h, UNREAD)
