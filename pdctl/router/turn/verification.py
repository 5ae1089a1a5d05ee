"""The verification stage: what a warm turn does with the handle it took, and how many prompt tokens its prefill
computes. The rules are verify.py's; this is where they meet the request.

    no handle                 -> a miss, for the reason the table gave
    verify_prefix off         -> a hit, unverified (the operator's choice)
    verify_at prefill         -> the handle goes to the prefill with the held tokens' digests; the prefill verifies
                                 against its own tokenization (text and chat: nothing on the way there)
    verify_at router          -> the prefill's /tokenize, then the comparison here
A token-id prompt is compared here with verify_at router; with verify_at prefill its handle goes to the prefill
with the digests too, since only the prefill knows what its own prefix cache holds (the cheapest source of the
history, pdctl.prefix_check), and the router keeps the ids for placement.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from typing import Any

import httpx

from pdctl.router import jsonx, wire
from pdctl.router.turn import choices, placement
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.history import added_tokens, token_ids
from pdctl.router.turn.state import RouterState
from pdctl.router.turn.verify import Verdict, as_tokens, at_prefill, hit_params, miss, verify
from pdctl.router.upstream.pools import Upstream

_TOKENIZE_CHAT = ("tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
                  "continue_final_message", "add_special_tokens", "mm_processor_kwargs", "documents")


@dataclass(frozen=True)
class Check:
    """The verdict, the prompt's ids when the router has them (it then verified), and the prompt tokens the prefill
    computes (placement's load): with the verdict's reuse, and (`redone`) with none."""

    verdict: Verdict
    ids: array[int] | None
    new_tokens: int
    all_tokens: int

    def redone(self, settled: Verdict) -> Check:
        """The same turn run again as a recompute (the decode could not use the first prefill's KV), given what the
        first prefill settled: a handle it read is spent."""
        verdict = miss(wire.PREFILL_REDONE) if settled.outcome != "miss" else settled
        return replace(self, verdict=verdict, new_tokens=self.all_tokens)

async def check(state: RouterState, ctx: RequestContext, p: Upstream) -> Check:
    verdict, ids = await _verdict(state, ctx, p)
    every = len(ids) if ids is not None else placement.prompt_tokens(ctx.body)
    new = _new_tokens(ctx, ids, verdict)
    h = ctx.taken.handle
    if h is not None and verdict.outcome != "miss":
        # Read or recompute (cost.py): the turn's break-even goes to the prefill with the handle.
        floor = state.config.min_read_tokens
        c = ctx.choice = choices.prefill_path(state.rates, state.decode.by_url(h.decode_url), p, verdict.tokens,
                                              max(new, 0), floor, ctx.choice)
        verdict = choices.with_min_read(verdict, c, floor)
        if verdict.outcome == "miss":
            new = every
    return Check(verdict, ids, new, every)


async def _verdict(state: RouterState, ctx: RequestContext, p: Upstream) -> tuple[Verdict, array[int] | None]:
    h = ctx.taken.handle
    if h is None:
        return miss(ctx.taken.reason), None
    cfg = state.config
    if not cfg.verify_prefix:
        return Verdict("hit", wire.UNVERIFIED, h.num_tokens, hit_params(h.params)), None
    ids = token_ids(ctx)
    if cfg.verify_at == "prefill" and (ids is None or h.spec is not None):
        # Token ids too: only the prefill knows what its own prefix cache holds, so it checks them and takes the
        # cheapest source (pdctl.prefix_check); the router keeps the ids for placement and the prefill's prompt.
        return at_prefill(h.params, h.spec), ids
    if ids is None:
        ids = await tokenize(state, ctx, p)
    if ids is None:
        return miss(wire.TOKENIZE_FAILED), None
    return verify(h.params, h.tokens, ids, cfg.block_size, cfg.partial_reuse), ids


def _new_tokens(ctx: RequestContext, ids: array[int] | None, verdict: Verdict) -> int:
    """Exact with ids, else what the request adds to the handle's history (history.py's bound) or, with nothing to
    relate it to, its size less the reuse."""
    if ids is not None:
        return len(ids) - verdict.tokens
    h = ctx.taken.handle
    added = added_tokens(ctx, h.history) if h is not None and verdict.outcome != "miss" else None
    return added if added is not None else placement.prompt_tokens(ctx.body) - verdict.tokens


async def tokenize(state: RouterState, ctx: RequestContext, p: Upstream) -> array[int] | None:
    """The new request's prompt token ids, as the chosen prefill computes them."""
    body = ctx.body
    # token_strs would double the answer (vLLM sends them only when asked); the router reads `tokens` alone.
    req: dict[str, Any] = {"model": body.get("model", state.config.model), "return_token_strs": False}
    if ctx.chat:
        req["messages"] = body.get("messages")
        req.update((k, body[k]) for k in _TOKENIZE_CHAT if k in body)
    else:
        req["prompt"] = body.get("prompt")
        if "add_special_tokens" in body:
            req["add_special_tokens"] = body["add_special_tokens"]
    try:
        resp = await state.http.post(f"{p.url}/tokenize", content=jsonx.dumps(req),
                                     headers={"content-type": "application/json"})
        if resp.status_code != 200:
            state.metrics.error("prefill", f"tokenize_{resp.status_code}")
            return None
        return as_tokens(jsonx.loads(resp.content).get("tokens"))
    except (httpx.HTTPError, jsonx.DecodeError, AttributeError):
        state.metrics.error("prefill", "tokenize")
        return None
