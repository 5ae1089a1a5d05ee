"""Conversation identity from the headers agent tools send, in a configured order of precedence.

The body's `conversation_id` wins (the JSON body step takes it out); else the first of `router.conversation_headers`
that the request carries. A Responses `previous_response_id` sits between the two (responses.py), and a request with
none of them is matched to a conversation from its own history (conversation.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdctl.router.turn.context import RequestContext


class ConversationHeaders:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = [n.strip().lower().encode("latin-1") for n in names]

    def resolve(self, ctx: RequestContext) -> None:
        """A POST whose body is read (or not asked for): its conversation id from the body, else from a header."""
        if ctx.cid is not None:
            ctx.cid_in_body = True
            return
        given = {k: v for k, v in reversed(ctx.headers)}  # the first of repeated headers wins
        value = next((given[n] for n in self.names if given.get(n)), None)
        if value is not None:
            ctx.cid = value.decode("latin-1")
