"""POST /v1/responses: the Responses API over the P/D path, with previous_response_id kept by the router.

The request becomes a chat completion (responses_in), runs through pipeline.completion (conversation identity,
handle, prefix verification, both hops, retry as recompute, affinity, metrics, X-PD-* headers), and the answer is
rendered back (responses_out). A follow-up naming `previous_response_id` is expanded to the kept history and runs
under that response's conversation id, unless the body names its own `conversation_id`.
"""

from __future__ import annotations

from starlette.types import Receive, Send

from pdctl.router.api.responses_in import BadInput, to_chat
from pdctl.router.api.responses_out import ResponsesRenderer, new_id, output_messages
from pdctl.router.api.translated import Translating
from pdctl.router.errors import send_error
from pdctl.router.turn import pipeline, request
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.state import RouterState


async def create(state: RouterState, ctx: RequestContext, receive: Receive, send: Send) -> None:
    store, body = state.responses, ctx.body
    prev = body.get("previous_response_id")
    whose = request.owner(ctx)
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
    sub = ctx.translated(req.body)
    if kept is not None and kept.conversation is not None and not ctx.cid_in_body:
        sub.conversation = kept.conversation

    def keep() -> None:  # before the client sees the response end: a follow-up may name it at once
        if renderer.finish is not None and body.get("store", True) is not False:
            store.put(response_id, req.history + output_messages(renderer.outputs), sub.conversation, whose)

    await pipeline.completion(state, sub, receive, Translating(send, renderer, keep))
