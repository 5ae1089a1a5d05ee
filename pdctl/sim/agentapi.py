"""The simulator's /v1/responses and /v1/messages, as vLLM serves them: each request rendered through the chat
template (vLLM does the same), answered whole or as the API's event stream.

vLLM's Anthropic endpoint accepts `kv_transfer_params` and returns them in a whole answer (its
AnthropicMessagesRequest / AnthropicMessagesResponse carry the field); its Responses endpoint has no such field.
The simulator mirrors both. pdctl's router uses neither: it translates both APIs into chat completions.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pdctl.sim.engine import EngineError
from pdctl.sim.protocol import Parsed
from pdctl.sim.tokenizer import decode, decode_piece


def _bad(message: str, param: str | None = None) -> EngineError:
    return EngineError(400, message, "BadRequestError", param)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    raise _bad("content must be a string or a list of parts", "input")


def responses_chat(body: Any) -> dict[str, Any]:
    """A Responses request as the chat request vLLM renders it to."""
    if not isinstance(body, dict) or "input" not in body:
        raise _bad("input: Field required", "input")
    items = body["input"]
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind == "message":
                messages.append({"role": item.get("role", "user"), "content": _text(item.get("content"))})
            elif kind == "function_call":
                call = {"id": item.get("call_id"), "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
                if messages and messages[-1]["role"] == "assistant":
                    messages[-1].setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                                 "content": _text(item.get("output", ""))})
            elif kind != "reasoning":
                raise _bad(f"Unknown input item type: {kind}", "input")
    else:
        raise _bad("input must be a string or a list of items", "input")
    tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
             for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"]
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "tools": tools,
                            "stream": bool(body.get("stream"))}
    choice = body.get("tool_choice", "auto")
    chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}} \
        if isinstance(choice, dict) else choice
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


def messages_chat(body: Any) -> dict[str, Any]:
    """An Anthropic Messages request as the chat request vLLM renders it to."""
    if not isinstance(body, dict) or not isinstance(body.get("max_tokens"), int):
        raise _bad("max_tokens: Field required", "max_tokens")
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str) or content is None:
            messages.append({"role": m.get("role"), "content": content or ""})
            continue
        text, calls = [], []
        for block in content:
            kind = block.get("type")
            if kind == "text":
                text.append(block.get("text", ""))
            elif kind == "tool_use":
                calls.append({"id": block.get("id"), "type": "function", "function": {
                    "name": block.get("name"), "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                 "content": _text(block.get("content") or "")})
        if text or calls or m.get("role") == "assistant":
            msg: dict[str, Any] = {"role": m.get("role"), "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
    tools = [{"type": "function", "function": {"name": t.get("name"), "parameters": t.get("input_schema")}}
             for t in body.get("tools") or () if isinstance(t, dict)]
    chat = {"model": body.get("model"), "messages": messages, "tools": tools, "max_tokens": body["max_tokens"],
            "stream": bool(body.get("stream")), "kv_transfer_params": body.get("kv_transfer_params")}
    choice = body.get("tool_choice") or {}
    chat["tool_choice"] = {"any": "required", "none": "none"}.get(str(choice.get("type")), "auto")
    return chat


def _usage(p: Parsed, n: int) -> tuple[int, int]:
    return len(p.prompt), n


def response_object(p: Parsed, rid: str, output: list[int], status: str = "completed") -> dict[str, Any]:
    if p.tool:
        items: list[dict[str, Any]] = [{"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": status,
                                        "call_id": p.tool.id, "name": p.tool.name, "arguments": p.tool.arguments}]
    else:
        items = [{"id": f"msg_{rid}", "type": "message", "status": status, "role": "assistant",
                  "content": [{"type": "output_text", "text": decode(output), "annotations": [], "logprobs": None}]}]
    prompt, completion = _usage(p, len(output))
    cut = p.finish_reason == "length" and status == "completed"
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": p.model, "output": items,
            "status": "incomplete" if cut else status,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "instructions": None, "metadata": None, "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
            "tool_choice": "auto", "tools": [], "usage": {
                "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}}


async def response_events(p: Parsed, rid: str, tokens: AsyncIterator[int]) -> AsyncIterator[str]:
    """The Responses event stream over the tokens as they come (text deltas, or one function call)."""
    seq = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq - 1, **fields})}\n\n"

    shell = response_object(p, rid, [], "in_progress")
    shell["output"], shell["usage"] = [], None
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    item = response_object(p, rid, [], "in_progress")["output"][0]
    if p.tool:
        item["arguments"] = ""
    else:
        item["content"] = []
    yield event("response.output_item.added", output_index=0, item=item)
    if not p.tool:
        yield event("response.content_part.added", item_id=item["id"], output_index=0, content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []})
    output: list[int] = []
    async for token in tokens:
        i = len(output)
        output.append(token)
        if p.tool:
            piece = (p.tool.delta(i).get("tool_calls") or [{}])[0].get("function", {}).get("arguments")
            if piece:
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=0,
                            delta=piece)
        else:
            yield event("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0,
                        delta=decode_piece(token), logprobs=[])
    final = response_object(p, rid, output)
    done = final["output"][0]
    done["id"] = item["id"]
    if p.tool:
        yield event("response.function_call_arguments.done", item_id=item["id"], output_index=0,
                    arguments=p.tool.arguments)
    else:
        text = done["content"][0]["text"]
        yield event("response.output_text.done", item_id=item["id"], output_index=0, content_index=0, text=text,
                    logprobs=[])
        yield event("response.content_part.done", item_id=item["id"], output_index=0, content_index=0,
                    part=done["content"][0])
    yield event("response.output_item.done", output_index=0, item=done)
    yield event("response.completed", response=final)


_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def message_object(p: Parsed, output: list[int], kv: dict[str, Any] | None) -> dict[str, Any]:
    if p.tool:
        block: dict[str, Any] = {"type": "tool_use", "id": p.tool.id, "name": p.tool.name,
                                 "input": json.loads(p.tool.arguments)}
    else:
        block = {"type": "text", "text": decode(output)}
    out = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": p.model,
           "content": [block], "stop_reason": _STOP.get(p.finish_reason, "end_turn"), "stop_sequence": None,
           "usage": {"input_tokens": len(p.prompt), "output_tokens": len(output)}}
    if kv is not None:
        out["kv_transfer_params"] = kv
    return out


async def message_events(p: Parsed, tokens: AsyncIterator[int]) -> AsyncIterator[str]:
    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    shell = message_object(p, [], None)
    shell["content"], shell["stop_reason"] = [], None
    yield event("message_start", message=shell)
    block = {"type": "tool_use", "id": p.tool.id, "name": p.tool.name, "input": {}} if p.tool else \
        {"type": "text", "text": ""}
    yield event("content_block_start", index=0, content_block=block)
    yield event("ping")
    n = 0
    async for token in tokens:
        i, n = n, n + 1
        if p.tool:
            piece = (p.tool.delta(i).get("tool_calls") or [{}])[0].get("function", {}).get("arguments")
            if piece:
                yield event("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": piece})
        else:
            yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": decode_piece(token)})
    yield event("content_block_stop", index=0)
    yield event("message_delta", delta={"stop_reason": _STOP.get(p.finish_reason, "end_turn"),
                                        "stop_sequence": None}, usage={"output_tokens": n})
    yield event("message_stop")
