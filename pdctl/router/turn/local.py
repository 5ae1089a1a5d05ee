"""Conditional disaggregation: whether a warm turn runs on the decode that holds its conversation, alone.

It does when that decode lacks at most `local_prefill_tokens` of the prompt (history.py bounds what a request adds
without tokenizing it; a token-id prompt is compared exactly) and the placement policy (placement.py), given the
decode's and the chosen prefill's load, agrees; the `cost` policy asks the cost model (cost.py, choices.py), which
until the rates it needs are measured answers with the `load` policy's rule on a decode with no other stream, and
sends the turn through the prefill beside other streams. Such a turn skips the prefill hop and
both transfers: the decode gets an ordinary request that hits its own prefix cache, and the handle stays pinned for
the next disaggregated turn. The decision is a value (`Local`, or None: disaggregate); the pipeline runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdctl.router.kv.handles import Handle
from pdctl.router.reasons import DECODE_CACHE
from pdctl.router.turn import choices, placement
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.cost import Choice
from pdctl.router.turn.history import added_tokens, token_ids
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.verify import matching_blocks
from pdctl.router.upstream import load
from pdctl.router.upstream.pools import Upstream


@dataclass(frozen=True)
class Local:
    """Run the turn on `decode`, which holds `held` tokens of it (whole blocks) and lacks at most `missing`."""

    decode: Upstream
    held: int
    missing: int


def decide(state: RouterState, ctx: RequestContext, h: Handle | None,
           prefill: Upstream | None = None) -> Local | None:
    """The decode holding the conversation, when it lacks at most `local_prefill_tokens` of the prompt and the
    placement policy (given the decode's and `prefill`'s requests in flight) runs the turn there; else None."""
    cfg = state.config
    limit = cfg.local_prefill_tokens
    if limit <= 0 or h is None or not cfg.verify_prefix:
        return None
    if state.handles.clock() - h.received > cfg.handle_lifetime / 2:
        return None  # disaggregate this turn: it pins a fresh handle before this one expires (else: a full miss)
    known = h.cached if h.cached is not None else h.tokens
    holder = next((u for u in state.decode.healthy() if u.url == h.decode_url), None)
    if known is None or holder is None:
        return None
    bs = cfg.block_size
    ids = token_ids(ctx)
    if ids is not None:
        held = matching_blocks(known, ids, bs) * bs  # vLLM's prefix cache holds whole blocks
        missing: int | None = len(ids) - held
    else:
        held, missing = len(known) // bs * bs, added_tokens(ctx, h.history)
    if held == 0 or missing is None:
        return None
    policy = cfg.local_policy
    if policy == "cost" and prefill is not None:
        c = ctx.choice = choices.local(state.rates, holder, prefill, held, missing, cfg.min_read_tokens,
                                       cfg.itl_slo_ms, limit, cfg.local_stall_ratio, cfg.decode_batch_tokens)
        if c.basis != "default":  # the model's choice, or a probe that measures the decode's local costs
            return Local(holder, held, missing) if c.source == DECODE_CACHE else None
        if c.refused is not None:
            return None  # its rates not yet measured and other streams on the decode to stall
        policy = "load"  # its rates not yet measured, nobody else to stall: the rule before the model
    prefill_load = load.load_of(prefill) if prefill is not None else None
    if not placement.run_locally(policy, missing, limit, load.load_of(holder), prefill_load,
                                 cfg.local_busy_streams):
        return None
    ctx.choice = Choice(DECODE_CACHE, None, 0.0, "default", cfg.min_read_tokens)
    return Local(holder, held, missing)
