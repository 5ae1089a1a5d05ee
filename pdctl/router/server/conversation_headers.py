"""Conversation identity from the headers agent tools send, in a configured order of precedence.

The body's `conversation_id` wins (JsonBody takes it out); else the first of `router.conversation_headers` that
the request carries. A Responses `previous_response_id` sits between the two (responses.py), and a request with
none of them is matched to a conversation from its own history (conversation.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from pdctl.router.turn.context import SCOPE_KEY, RequestContext


class ConversationHeaders:
    def __init__(self, app: ASGIApp, names: Sequence[str]) -> None:
        self.app = app
        self.names = [n.strip().lower().encode("latin-1") for n in names]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":  # JsonBody let it through: its body is parsed
            ctx: RequestContext = scope[SCOPE_KEY]
            if ctx.cid is not None:
                ctx.cid_in_body = True
            else:
                given = {k: v for k, v in reversed(ctx.headers)}  # the first of repeated headers wins
                value = next((given[n] for n in self.names if given.get(n)), None)
                if value is not None:
                    ctx.cid = value.decode("latin-1")
        await self.app(scope, receive, send)
