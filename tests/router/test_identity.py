"""Which conversation a request belongs to, from the headers agent tools send (router.conversation_headers)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.router.conftest import AGENT_KEY, RouterProc
from tests.support.sim_procs import SERVED

USER = "tell me about w81 w82 w83 w84 " * 8
AUTH = {"Authorization": f"Bearer {AGENT_KEY}"}


def _turn(router: RouterProc, messages: list[dict[str, str]], headers: dict[str, str]) -> httpx.Response:
    r = httpx.post(router.url + "/v1/chat/completions", json={"model": SERVED, "messages": messages,
                                                               "max_tokens": 4}, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _second_turn_reason(router: RouterProc, first: dict[str, str], second: dict[str, str]) -> str:
    """Turn 2 resends turn 1 with its reply changed, so only an id can tie them: which reason does it get?"""
    user = USER + uuid.uuid4().hex
    _turn(router, [{"role": "user", "content": user}], {**AUTH, **first})
    edited = [{"role": "user", "content": user}, {"role": "assistant", "content": "edited"},
              {"role": "user", "content": "go on"}]
    return _turn(router, edited, {**AUTH, **second}).headers["x-pd-kv-reuse"].rsplit("reason=", 1)[1]


@pytest.mark.parametrize("name", ["X-Conversation-Id", "X-Session-ID", "X-Correlation-Id", "X-Session-Affinity",
                                  "X-LiteLLM-Session-Id"])
def test_each_default_header_names_the_conversation(router: RouterProc, name: str) -> None:
    cid = {name: uuid.uuid4().hex}
    assert _second_turn_reason(router, cid, cid) == "prefix_diverged"  # the handle was found (and refused)
    assert _second_turn_reason(router, cid, {}) == "new_conversation"


def test_precedence_follows_the_configured_list(router: RouterProc) -> None:
    session, other = uuid.uuid4().hex, uuid.uuid4().hex
    # X-Session-ID comes before X-Correlation-Id: a per-request correlation id does not split the conversation.
    reason = _second_turn_reason(router, {"X-Session-ID": session, "X-Correlation-Id": other},
                                 {"X-Session-ID": session, "X-Correlation-Id": uuid.uuid4().hex})
    assert reason == "prefix_diverged"


def test_a_configured_header_and_the_body_id(agent_router: RouterProc) -> None:
    mine = {"X-My-Conversation": uuid.uuid4().hex}
    assert _second_turn_reason(agent_router, mine, mine) == "prefix_diverged"
    # Headers not in the configured list name nothing on this router ...
    lite = {"X-LiteLLM-Session-Id": uuid.uuid4().hex}
    assert _second_turn_reason(agent_router, lite, lite) == "new_conversation"
    # ... and the body's conversation_id wins over every header.
    user = USER + uuid.uuid4().hex
    body = {"model": SERVED, "max_tokens": 4, "conversation_id": "body-" + uuid.uuid4().hex,
            "messages": [{"role": "user", "content": user}]}
    assert httpx.post(agent_router.url + "/v1/chat/completions", json=body, headers={**AUTH, **mine},
                      timeout=30).status_code == 200
    body["messages"] = [*body["messages"], {"role": "assistant", "content": "edited"}, {"role": "user", "content": "x"}]
    fresh = {"X-My-Conversation": uuid.uuid4().hex}
    r = httpx.post(agent_router.url + "/v1/chat/completions", json=body, headers={**AUTH, **fresh}, timeout=30)
    assert r.headers["x-pd-kv-reuse"].endswith("reason=prefix_diverged")


def test_a_bad_header_name_is_a_usage_error() -> None:
    from pdctl.errors import UsageError
    from pdctl.router.config import RouterConfig

    with pytest.raises(UsageError, match=r"--conversation-header 'x session' is not an HTTP header name"):
        RouterConfig(prefill=("http://p",), decode=("http://d",), conversation_headers=("x session",))
