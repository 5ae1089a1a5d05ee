"""Chat answers as neutral events (whole and streamed alike), and a chat-completions agent loop with tools."""

from __future__ import annotations

import json
from typing import Any

import openai

from pdctl.router.api.chatstream import ChatReader, Finish, Text, ToolArgs, ToolStart, Usage, reused_tokens
from tests.router.agents import CHAT_TOOLS, FIRST, assert_loop_reused, outcome
from tests.router.conftest import RouterProc, assert_clean
from tests.support.sim_procs import SERVED, SimPair


def test_whole_and_streamed_answers_give_the_same_events() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}
    whole = {"model": "m", "choices": [{"index": 0, "message": {"content": "hi", "tool_calls": [call]},
                                        "finish_reason": "tool_calls"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 2}}
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {
            "name": "lookup", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": 1}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
    ]
    expected = [Text("hi"), ToolStart(0, "call_1", "lookup"), ToolArgs(0, '{"q": 1}'), Finish("tool_calls"),
                Usage(5, 2)]
    assert ChatReader().whole(whole) == expected
    reader = ChatReader()
    assert [e for c in chunks for e in reader.chunk(c)] == expected


def test_only_choice_zero_counts_and_reuse_is_read_from_the_header() -> None:
    other = {"choices": [{"index": 1, "delta": {"content": "no"}}]}
    assert ChatReader().chunk(other) == []
    assert reused_tokens([(b"x-pd-kv-reuse", b"hit;tokens=96;reason=verified")]) == 96
    assert reused_tokens([(b"x-pd-kv-reuse", b"miss;tokens=0;reason=new_conversation")]) == 0


def test_chat_agent_loop_with_tools_reuses_every_turn(router: RouterProc, pd: SimPair) -> None:
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    hits = router.stats()["reuse"]["hit"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST}]
    outcomes, finishes = [], []
    for _ in range(5):
        raw = c.chat.completions.with_raw_response.create(model=SERVED, messages=messages,  # type: ignore[arg-type]
                                                          tools=CHAT_TOOLS)  # type: ignore[arg-type]
        resp = raw.parse()
        assert_clean(raw.http_response.content, raw.headers)
        outcomes.append(outcome(raw.headers))
        choice = resp.choices[0]
        finishes.append(choice.finish_reason)
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.message.tool_calls:
            call = choice.message.tool_calls[0]
            query = json.loads(call.function.arguments)["query"]  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"found {query}"})
        else:
            messages.append({"role": "user", "content": "and the next one w21 w22"})
    assert finishes == ["tool_calls", "stop", "tool_calls", "stop", "tool_calls"]
    assert_loop_reused(outcomes, router, pd, hits)
