"""Tool calls, as vLLM serves them with `--enable-auto-tool-choice --tool-call-parser hermes`.

The simulated model calls a tool when the request offers tools, tool_choice is not "none", and either the
choice forces a call (`required`, a named function) or the last message is the user's (after a tool result it
answers in text). It calls the named tool or the first one, with arguments `{"query": "<three words>"}` drawn
from the prompt, and writes the call as `<tool_call> name arguments </tool_call>` tokens: exactly what the chat
template renders for that assistant message, so the next turn's prompt extends the decode's KV.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from pdctl.sim.tokenizer import generate, token_str, tool_call_ids


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    @property
    def ids(self) -> list[int]:
        return tool_call_ids(self.name, self.arguments)

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def delta(self, i: int) -> dict[str, Any]:
        """What output token i adds to the streamed call: its header first, then one argument word per token."""
        if i == 0:
            return {"tool_calls": [{"index": 0, "id": self.id, "type": "function",
                                    "function": {"name": self.name, "arguments": ""}}]}
        words = self.arguments.split(" ")
        first = len(self.ids) - 1 - len(words)  # tokens: start, name..., argument words..., end
        k = i - first
        if 0 <= k < len(words):
            piece = words[k] if k == 0 else " " + words[k]
            return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        return {}


def _tool_names(tools: Any) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def decide(body: dict[str, Any], prompt: list[int], max_tokens: int) -> ToolCall | None:
    """The call the model makes for this chat request, or None (it answers in text)."""
    names = _tool_names(body.get("tools"))
    choice = body.get("tool_choice", "auto")
    if not names or choice == "none":
        return None
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    messages = body.get("messages") or []
    last = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
    if named is None and choice != "required" and last != "user":
        return None
    name = named if isinstance(named, str) else names[0]
    words = " ".join(token_str(t) for t in generate(prompt, 3))
    call = ToolCall(f"chatcmpl-tool-{uuid.uuid4().hex}", name, json.dumps({"query": words}))
    return call if len(call.ids) <= max_tokens else None
