"""What a finished stage tells the cost model's rates (rates.py), and each warm turn's choice recorded with its
measured time to first token (choices.py). Called by the pipeline once per hop; O(1), nothing allocated.

    prefill hop that read nothing   the prefill's compute rate: its computed tokens plus those queued ahead of them
                                    there, over the hop's time
    prefill hop that read           the D->P read rate of the pair: the tokens read over the hop's time less its
                                    compute at the prefill's measured rate
    decode after a pull (streamed)  the P->D pull rate of the pair: the tokens offered over the decode's time to
                                    first byte less one step
    local turn (streamed)           the decode's own compute rate, the same way; where the decode's token budget
                                    is known, its whole time to first byte against the token slots of the steps
                                    that computed the prompt (cost.Turn.steps x chunk)
The decode's step time comes from the streams it relays (decode.py).
"""

from __future__ import annotations

from pdctl.router.reasons import D_TO_P, P_TO_D
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.cost import Turn, chunk_of
from pdctl.router.turn.state import RouterState
from pdctl.router.upstream.pools import Upstream


def _first_s(ctx: RequestContext) -> float | None:
    """The turn's time to first token as the router saw it (None: not streamed, or no first byte)."""
    if not ctx.first_byte or not ctx.body.get("stream"):
        return None
    return ctx.first_byte - ctx.started


def _decode_s(state: RouterState, ctx: RequestContext, d: Upstream, steps: int = 1) -> float | None:
    """The decode's time to first byte less `steps` of its steps (streamed turns only)."""
    if not ctx.first_byte or not ctx.decode_sent or not ctx.body.get("stream"):
        return None
    e = state.rates.engine(d.url, d.generation)
    step = e.step_ms(d.outstanding + 1, state.rates.clock()) or 0.0
    return ctx.first_byte - ctx.decode_sent - steps * step / 1000


def prefill_hop(state: RouterState, p: Upstream, holder: str, context: int, ahead: int, computed: int, read: int,
                seconds: float) -> None:
    rates = state.rates
    if read <= 0:
        rates.computed(p.url, p.generation, context, ahead + computed, seconds)
        return
    compute = rates.engine(p.url, p.generation).compute_line(context, rates.clock())
    if compute is not None and holder:
        rates.moved(D_TO_P, holder, p.url, read, seconds - compute.ms(ahead + computed) / 1000)


def pulled(state: RouterState, ctx: RequestContext, p: Upstream | None, d: Upstream | None,
           offered: int | None) -> None:
    if p is None or d is None or offered is None:
        return
    t = _decode_s(state, ctx, d)
    if t is not None:
        state.rates.moved(P_TO_D, p.url, d.url, offered, t)


def local_turn(state: RouterState, ctx: RequestContext, d: Upstream, context: int, ahead: int, missing: int) -> None:
    streams = max(d.outstanding - 1, 0)  # the others: this turn is in flight there too
    turn = Turn(0, missing, streams, ahead, 0, chunk_of(state.config.decode_batch_tokens, streams))
    if turn.chunk > 0:  # the whole time to first byte, against the token slots of the steps that computed it
        t, tokens = _decode_s(state, ctx, d, 0), turn.steps * turn.chunk
    else:
        t, tokens = _decode_s(state, ctx, d), ahead + missing
    if t is not None:
        state.rates.computed(d.url, d.generation, context, tokens, t)


def chosen(state: RouterState, ctx: RequestContext) -> None:
    """The warm turn's choice, with its measured TTFT, for /stats, /metrics and the trace."""
    c = ctx.choice
    if c is None:
        return
    measured = _first_s(ctx)
    state.choices.made(c, measured)
    tr = ctx.trace
    if tr is not None:
        a = tr.root.attrs
        a["pdctl.kv.choice"] = c.source
        a["pdctl.kv.choice.basis"] = c.basis
        a["pdctl.kv.choice.min_read"] = c.min_read
        if c.refused is not None:
            a["pdctl.kv.choice.local_refused"] = c.refused
        if c.ttft_ms is not None:
            a["pdctl.kv.choice.predicted_ttft_ms"] = round(c.ttft_ms, 1)
            a["pdctl.kv.choice.others_stall_ms"] = round(c.others_ms, 1)
        if measured is not None:
            a["pdctl.kv.choice.measured_ttft_ms"] = round(measured * 1000, 1)
