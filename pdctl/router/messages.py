"""POST /v1/messages: Anthropic Messages over the P/D path.

The request becomes a chat completion (messages_in), runs through proxy.completion with every guarantee of the
chat path, and the answer is rendered back (messages_out). Errors on this route are in Anthropic's shape
(apishape.AnthropicErrors rewrites the shared code's OpenAI-shaped ones).
"""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send

from pdctl.router import proxy
from pdctl.router.errors import send_error
from pdctl.router.messages_in import to_chat
from pdctl.router.messages_out import MessagesRenderer
from pdctl.router.responses import chat_scope
from pdctl.router.responses_in import BadInput
from pdctl.router.state import RouterState
from pdctl.router.translated import Translating


async def create(state: RouterState, scope: Scope, receive: Receive, send: Send) -> None:
    body: dict[str, Any] = scope["pdctl.body"]
    try:
        chat = to_chat(body, state.config.model)
    except BadInput as e:
        await send_error(send, 400, e.message)
        return
    out = Translating(send, MessagesRenderer(chat["model"]))
    await proxy.completion(state, chat_scope(scope, chat), receive, out, chat=True)
