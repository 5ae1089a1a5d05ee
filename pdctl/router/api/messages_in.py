"""An Anthropic Messages request as the chat completion that the P/D path serves.

    system (string or text blocks)      -> a leading system message
    user text / image blocks            -> a user message; its tool_result blocks -> tool messages before it
                                           (each tool_use_id must name an earlier tool_use)
    assistant text / tool_use blocks    -> an assistant message with content and tool_calls (input as JSON text)
    assistant thinking blocks           -> that message's `reasoning` (chat templates drop it from history)
    tools, tool_choice, max_tokens, stop_sequences, thinking -> chat tools, tool_choice, max_tokens, stop,
                                           chat_template_kwargs.enable_thinking
Anything else is refused with a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from pdctl.router.api.responses_in import BadInput

_SAME = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs", "ignore_eos")  # the last two: vLLM's


def _tool_result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadInput(f"{where}.content[{n}]: tool_result content must be text blocks", where)
            texts.append(block["text"])
        return "".join(texts)
    raise BadInput(f"{where}.content must be a string or a list of text blocks", where)


def _image(block: dict[str, Any], where: str) -> dict[str, Any]:
    src = block.get("source")
    if isinstance(src, dict) and src.get("type") == "base64" and isinstance(src.get("data"), str):
        url = f"data:{src.get('media_type', 'image/png')};base64,{src['data']}"
    elif isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise BadInput(f"{where}: an image block needs a base64 or url source", where)
    return {"type": "image_url", "image_url": {"url": url}}


def _user(content: list[Any], where: str, calls: set[str]) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for n, block in enumerate(content):
        at = f"{where}.content[{n}]"
        b: dict[str, Any] = block if isinstance(block, dict) else {}
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image(b, at))
        elif kind == "tool_result":
            use_id = b.get("tool_use_id")
            if not isinstance(use_id, str) or use_id not in calls:
                raise BadInput(f"{at}: tool_result for tool_use_id {use_id!r}, but no tool_use with that id "
                               "precedes it", at)
            tools.append({"role": "tool", "tool_call_id": use_id, "content": _tool_result_text(b.get("content"), at)})
        else:
            raise BadInput(f"{at}: a user message cannot hold a block of type {kind!r} (text, image, tool_result)",
                           at)
    if not parts:
        return tools
    if all(p["type"] == "text" for p in parts) and len(parts) == 1:
        return [*tools, {"role": "user", "content": parts[0]["text"]}]
    return [*tools, {"role": "user", "content": parts}]


def _assistant(content: list[Any], where: str, calls: set[str]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for n, block in enumerate(content):
        at = f"{where}.content[{n}]"
        b: dict[str, Any] = block if isinstance(block, dict) else {}
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            msg["content"] += b["text"]
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or \
                    not isinstance(b.get("input", {}), dict):
                raise BadInput(f"{at}: a tool_use block needs a string id and name and an object input", at)
            calls.add(b["id"])
            msg.setdefault("tool_calls", []).append({"id": b["id"], "type": "function", "function": {
                "name": b["name"], "arguments": json.dumps(b.get("input", {}))}})
        elif kind == "thinking":
            msg["reasoning"] = msg.get("reasoning", "") + str(b.get("thinking") or "")
        elif kind == "redacted_thinking":
            continue
        else:
            raise BadInput(f"{at}: an assistant message cannot hold a block of type {kind!r} (text, tool_use, "
                           "thinking)", at)
    return msg


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list) and all(isinstance(b, dict) and b.get("type") == "text" and
                                        isinstance(b.get("text"), str) for b in system):
        return "\n".join(b["text"] for b in system)
    raise BadInput("`system` must be a string or a list of text blocks", "system")


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadInput("`tools` must be a list", "tools")
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or \
                not isinstance(tool.get("input_schema"), dict):
            raise BadInput(f"tools[{n}]: only client tools with a name and an input_schema are served", "tools")
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    c: dict[str, Any] = choice if isinstance(choice, dict) else {}
    kind = c.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(c.get("name"), str):
        return {"type": "function", "function": {"name": c["name"]}}
    raise BadInput("`tool_choice` must be {\"type\": auto|any|none} or {\"type\": \"tool\", \"name\": ...}",
                   "tool_choice")


def to_chat(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The chat request for a Messages request."""
    limit = body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise BadInput("`max_tokens` is required and must be an integer >= 1", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadInput("`messages` must be a non-empty list", "messages")
    out: list[dict[str, Any]] = []
    if body.get("system"):
        out.append({"role": "system", "content": _system(body["system"])})
    calls: set[str] = set()
    for n, m in enumerate(messages):
        where = f"messages[{n}]"
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            raise BadInput(f"{where}.role must be user or assistant, got {role!r}", where)
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += _user(content, where, calls) if role == "user" else [_assistant(content, where, calls)]
        else:
            raise BadInput(f"{where}.content must be a string or a list of content blocks", where)
    chat: dict[str, Any] = {"model": body.get("model") or model, "messages": out, "max_tokens": limit}
    chat.update((k, body[k]) for k in _SAME if body.get(k) is not None)
    stop = body.get("stop_sequences")
    if stop:
        chat["stop"] = stop
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        kwargs = dict(chat.get("chat_template_kwargs") or {})
        kwargs["enable_thinking"] = thinking["type"] == "enabled"
        chat["chat_template_kwargs"] = kwargs
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat
