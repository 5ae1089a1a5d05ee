"""The per-request context: what a translated request and a batch's prompts inherit from the client's."""

from __future__ import annotations

from pdctl.router.server.routes import ROUTES
from pdctl.router.turn.context import NO_BODY, NOT_TAKEN, RequestContext


def _client(path: str, body: dict[str, object], cid: object = None) -> RequestContext:
    ctx = RequestContext("rid1", 1.0, "POST", path, [(b"authorization", b"Bearer k")], b"", ROUTES.match(path),
                         NO_BODY)
    ctx.body, ctx.cid = body, cid
    return ctx


def test_a_translated_request_runs_on_the_chat_route_with_the_clients_identity() -> None:
    ctx = _client("/v1/messages", {"messages": []}, cid="c1")
    sub = ctx.translated({"messages": [{"role": "user", "content": "hi"}]})
    assert (sub.path, sub.chat, sub.cid, sub.rid, sub.headers) == ("/v1/chat/completions", True, "c1", "rid1",
                                                                  ctx.headers)
    assert (ctx.path, ctx.chat, ctx.body) == ("/v1/messages", False, {"messages": []})
    sub.conversation = "pinned"
    assert ctx.conversation is None


def test_each_prompt_of_a_batch_is_its_own_conversation() -> None:
    ctx = _client("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3}, cid=7)
    first, second = ctx.prompt(0, "a"), ctx.prompt(1, "b")
    assert (first.body, first.cid, second.cid) == ({"prompt": "a", "max_tokens": 3}, "7#0", "7#1")
    assert ctx.body == {"prompt": ["a", "b"], "max_tokens": 3}
    assert _client("/v1/completions", {"prompt": ["a"]}).prompt(0, "a").cid is None


def test_a_turn_without_a_handle_has_no_holder() -> None:
    ctx = _client("/v1/chat/completions", {"messages": []})
    assert ctx.taken is NOT_TAKEN and ctx.holder == "" and not ctx.taken.eligible
