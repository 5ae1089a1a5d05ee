"""One conversation turn, served in the router's mode: through a prefill and a decode (proxy.py), or whole on one
aggregated engine (aggregated.py). The agent-API fronts (responses.py, messages.py) and the chat and completions
routes call this, so each mode has one entry and neither module knows the other's."""

from __future__ import annotations

from starlette.types import Receive, Send

from pdctl.router.turn import aggregated
from pdctl.router.turn import pipeline as proxy
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState


async def completion(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    if state.config.mode == "aggregated":
        await aggregated.completion(state, ctx, receive, send)
    else:
        await proxy.completion(state, ctx, receive, send)
