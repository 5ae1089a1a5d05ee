"""POST /v1/chat/completions and /v1/completions: one conversation turn, or a request that is several (batches.py).

These are the engines' own APIs, so nothing is translated: the body goes to the turn pipeline as the client sent
it (less what the entry steps took out: `kv_transfer_params`, `conversation_id`).
"""

from __future__ import annotations

from starlette.types import Receive, Send

from pdctl.router.api import batches
from pdctl.router.turn import pipeline
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState


async def generation(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    """Chat and completions: one conversation turn (turn/pipeline.py, in the router's mode), or a list of prompts
    or n > 1 samples (batches.py)."""
    if not ctx.chat and (batch := batches.prompts(ctx.body)) is not None:
        await batches.completions(state, ctx, receive, send, batch)
    elif batches.samples(ctx.body) > 1:
        await batches.sampled(state, ctx, receive, send)
    else:
        await pipeline.completion(state, ctx, receive, send)
