"""POST /v1/messages: Anthropic Messages over the P/D path.

The request becomes a chat completion (messages_in), runs through pipeline.completion with every guarantee of the
chat path, and the answer is rendered back (messages_out). Errors on this route are in Anthropic's shape
(server/anthropic_errors.py rewrites the shared code's OpenAI-shaped ones).
"""

from __future__ import annotations

from starlette.types import Receive, Send

from pdctl.router.api.messages_in import to_chat
from pdctl.router.api.messages_out import MessagesRenderer
from pdctl.router.api.responses_in import BadInput
from pdctl.router.api.translated import Translating
from pdctl.router.errors import send_error
from pdctl.router.turn import pipeline
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState


async def create(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    try:
        chat = to_chat(ctx.body, state.config.model)
    except BadInput as e:
        await send_error(send, 400, e.message)
        return
    out = Translating(send, MessagesRenderer(chat["model"]))
    await pipeline.completion(state, ctx.translated(chat), receive, out)
