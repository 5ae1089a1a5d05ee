"""The simulator's tool calls: when it makes one, and that its tokens are what the template renders back."""

from __future__ import annotations

import json

from pdctl.sim.tokenizer import TOOL_CALL_END, TOOL_CALL_START, render_chat
from pdctl.sim.tools import decide

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}},
         {"type": "function", "function": {"name": "other", "parameters": {}}}]


def test_a_call_follows_a_user_turn_and_text_follows_a_tool_result() -> None:
    user = [{"role": "user", "content": "find w1"}]
    call = decide({"messages": user, "tools": TOOLS}, [1, 2, 3], 64)
    assert call is not None and call.name == "lookup" and set(json.loads(call.arguments)) == {"query"}
    after = [*user, {"role": "assistant", "tool_calls": [call.openai()]},
             {"role": "tool", "tool_call_id": call.id, "content": "x"}]
    assert decide({"messages": after, "tools": TOOLS}, [1, 2, 3], 64) is None
    assert decide({"messages": after, "tools": TOOLS, "tool_choice": "required"}, [1], 64) is not None
    named = {"type": "function", "function": {"name": "other"}}
    assert decide({"messages": user, "tools": TOOLS, "tool_choice": named}, [1], 64).name == "other"  # type: ignore[union-attr]
    assert decide({"messages": user, "tools": TOOLS, "tool_choice": "none"}, [1], 64) is None
    assert decide({"messages": user}, [1], 64) is None
    assert decide({"messages": user, "tools": TOOLS}, [1], 3) is None  # no room for the call: text


def test_the_call_tokens_are_the_next_prompt_and_stream_as_its_arguments() -> None:
    history = [{"role": "user", "content": "find w1"}]
    prompt = render_chat(history)
    call = decide({"messages": history, "tools": TOOLS}, prompt, 64)
    assert call is not None and call.ids[0] == TOOL_CALL_START and call.ids[-1] == TOOL_CALL_END
    nxt = render_chat([*history, {"role": "assistant", "content": None, "tool_calls": [call.openai()]}])
    assert nxt[: len(prompt) + len(call.ids)] == prompt + call.ids
    deltas = [call.delta(i) for i in range(len(call.ids))]
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": ""}
    streamed = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:] if d)
    assert streamed == call.arguments
