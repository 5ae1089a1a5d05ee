"""A Responses API request as the chat completion that the P/D path serves.

    instructions                   -> a leading system message (not carried over by previous_response_id)
    input: "text"                  -> one user message
    input items                    -> messages: `message` (easy or typed), consecutive `function_call`s merged into
                                      the preceding assistant message's tool_calls, `function_call_output` -> a tool
                                      message (its call_id must name an earlier call), `reasoning` -> the next
                                      assistant message's `reasoning`
    tools (function), tool_choice  -> chat tools / tool_choice
    max_output_tokens, text.format -> max_tokens, response_format
Anything the router cannot honour is refused with a 400 naming the field, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdctl.router import jsonx

# Fields copied as they are onto the chat request (sampling and vLLM extensions with the same meaning).
_SAME = ("temperature", "top_p", "top_k", "seed", "stop", "parallel_tool_calls", "user", "logit_bias",
         "repetition_penalty", "priority", "cache_salt", "chat_template_kwargs", "min_p", "ignore_eos",
         "stream", "skip_special_tokens", "include_stop_str_in_output")
_REFUSED = {
    "background": "background responses are not served by the router",
    "conversation": "conversation objects are not kept by the router; use previous_response_id or send the input",
    "prompt": "prompt templates are not served by the router",
    "previous_response": "previous_response is not served by the router; use previous_response_id",
}


class BadInput(Exception):
    """A request the router refuses, with the field it is about."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass
class ChatRequest:
    body: dict[str, Any]  # the chat completion request
    history: list[dict[str, Any]]  # its messages without the instructions (what previous_response_id continues)


def _text_parts(content: Any, where: str, assistant: bool) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadInput(f"{where}.content must be a string or a list of content parts", where)
    parts: list[dict[str, Any]] = []
    for n, raw in enumerate(content):
        part: dict[str, Any] = raw if isinstance(raw, dict) else {}
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and not assistant and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise BadInput(f"{where}.content[{n}]: content part of type {kind!r} is not served here (input_text, "
                           f"output_text, refusal{'' if assistant else ', input_image with image_url'})", where)
    if all(p["type"] == "text" for p in parts) and (assistant or len(parts) == 1):
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        text = _text_parts(output, where, assistant=True)
        if isinstance(text, str):
            return text
    raise BadInput(f"{where}.output must be a string or a list of input_text parts", where)


def _reasoning_text(item: dict[str, Any]) -> str:
    parts = [p for p in (item.get("content") or []) if isinstance(p, dict)]
    parts = parts or [p for p in (item.get("summary") or []) if isinstance(p, dict)]
    return "".join(str(p.get("text", "")) for p in parts)


def items_to_messages(items: Any, known_calls: set[str]) -> list[dict[str, Any]]:
    """Input items as chat messages; `known_calls` holds the call ids of the history before them (updated)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise BadInput("`input` must be a string or a non-empty list of items", "input")
    out: list[dict[str, Any]] = []
    reasoning: str | None = None
    for n, item in enumerate(items):
        where = f"input[{n}]"
        if not isinstance(item, dict):
            raise BadInput(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadInput(f"{where}.role must be user, system, developer or assistant, got {role!r}", where)
            msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                   "content": _text_parts(item.get("content"), where, role == "assistant")}
            if role == "assistant" and reasoning is not None:
                msg["reasoning"] = reasoning
            reasoning = None
            out.append(msg)
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, str):
                raise BadInput(f"{where}: a function_call needs string call_id, name and arguments", where)
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant" or reasoning is not None:
                last = {"role": "assistant", "content": ""}
                if reasoning is not None:
                    last["reasoning"] = reasoning
                out.append(last)
            reasoning = None
            last.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
            known_calls.add(call_id)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise BadInput(f"{where}: a function_call_output needs a string call_id", where)
            if call_id not in known_calls:
                raise BadInput(f"{where}: function_call_output for call_id {call_id!r}, but no function_call with "
                               "that call_id precedes it", where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": _output_text(item.get("output"), where)})
        elif kind == "reasoning":
            reasoning = _reasoning_text(item)
        else:
            raise BadInput(f"{where}: unknown input item type {kind!r}; the router serves message, function_call, "
                           "function_call_output and reasoning items", where)
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadInput("`tools` must be a list", "tools")
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadInput(f"tools[{n}]: only function tools with a name are served (got type {kind!r})", "tools")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadInput("`tool_choice` must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                   "tool_choice")


def _format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise BadInput("`text.format` must be of type text, json_object or json_schema", "text")


def to_chat(body: dict[str, Any], previous: list[dict[str, Any]] | None, model: str) -> ChatRequest:
    """The chat request for a Responses request; `previous` is the history its previous_response_id names."""
    for key, why in _REFUSED.items():
        if body.get(key):
            raise BadInput(f"`{key}`: {why}", key)
    if "input" not in body:
        raise BadInput("`input` is required", "input")
    history = [dict(m) for m in previous or ()]
    known = {c["id"] for m in history for c in m.get("tool_calls") or () if isinstance(c.get("id"), str)}
    history += items_to_messages(body["input"], known)
    chat: dict[str, Any] = {"model": body.get("model") or model}
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadInput("`instructions` must be a string", "instructions")
    chat["messages"] = ([{"role": "system", "content": instructions}] if instructions else []) + history
    chat.update((k, body[k]) for k in _SAME if body.get(k) is not None)
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise BadInput(f"`max_output_tokens` must be an integer >= 1, got {jsonx.dumps(limit).decode()}",
                           "max_output_tokens")
        chat["max_tokens"] = limit
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    effort = body.get("reasoning", {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort is not None:
        chat["reasoning_effort"] = effort
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return ChatRequest(chat, history)
