"""POST /v1/responses: the Responses API over the P/D path, with previous_response_id kept by the router.

The request becomes a chat completion (responses_in), runs through proxy.completion (conversation identity,
handle, prefix verification, both hops, retry as recompute, affinity, metrics, X-PD-* headers), and the answer is
rendered back (responses_out). A follow-up naming `previous_response_id` is expanded to the kept history and runs
under that response's conversation id, unless the body names its own `conversation_id`.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import Receive, Scope, Send

from pdctl.router import proxy
from pdctl.router.errors import send_error
from pdctl.router.response_store import ResponseStore
from pdctl.router.responses_in import BadInput, to_chat
from pdctl.router.responses_out import ResponsesRenderer, new_id, output_messages
from pdctl.router.state import RouterState
from pdctl.router.translated import Translating

log = logging.getLogger("pdctl.router")


def chat_scope(scope: Scope, body: dict[str, Any]) -> Scope:
    """The scope proxy.completion sees: the chat route and the translated body; the rest is the client's."""
    sub = dict(scope)
    sub["path"] = "/v1/chat/completions"
    sub["pdctl.body"] = body
    return sub


async def create(state: RouterState, store: ResponseStore, scope: Scope, receive: Receive, send: Send) -> None:
    body: dict[str, Any] = scope["pdctl.body"]
    prev = body.get("previous_response_id")
    whose = proxy.owner(scope, body)
    kept = None
    if prev is not None:
        kept = store.get(prev, whose) if isinstance(prev, str) else None
        if kept is None:
            await send_error(send, 400, f"previous_response_id {prev!r} is unknown or expired: the router keeps a "
                             f"response for {store.lifetime:g}s (as long as its KV) and only when `store` is not "
                             "false; send the whole conversation as `input` instead")
            return
    try:
        req = to_chat(body, kept.history if kept else None, state.config.model)
    except BadInput as e:
        await send_error(send, 400, e.message)
        return
    response_id = new_id("resp")
    renderer = ResponsesRenderer(body, req.body["model"], response_id)
    out = Translating(send, renderer)
    sub = chat_scope(scope, req.body)
    if kept is not None and kept.conversation is not None and not scope.get("pdctl.cid_in_body"):
        sub["pdctl.conversation"] = kept.conversation
    await proxy.completion(state, sub, receive, out, chat=True)
    if out.ok and renderer.finish is not None and body.get("store", True) is not False:
        store.put(response_id, req.history + output_messages(renderer.items), sub.get("pdctl.conversation"), whose)
