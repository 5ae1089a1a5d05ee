"""A turn rendered as Anthropic Messages answers it: the `message` object, or its event stream.

Streamed: message_start, ping, then per content block content_block_start, content_block_delta* (text_delta,
thinking_delta, input_json_delta), content_block_stop; then message_delta (stop_reason, usage) and message_stop.
A decode failure mid-stream ends it with an `error` event. Chat finish reasons map to stop reasons:
stop -> end_turn, length -> max_tokens, tool_calls -> tool_use.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pdctl.router import jsonx
from pdctl.router.apishape import anthropic_error
from pdctl.router.chatstream import Event, Finish, Reasoning, Text, ToolArgs, ToolStart, Usage

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessagesRenderer:
    def __init__(self, model: str) -> None:
        self.model = model
        self.id = f"msg_{uuid.uuid4().hex}"
        self.reused = 0
        self.blocks: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage = (0, 0)

    def start(self) -> bytes:
        message = self._message(content=[], stop=None)
        return _event("message_start", message=message) + _event("ping")

    def feed(self, events: list[Event]) -> bytes:
        return b"".join(self._one(e) for e in events)

    def end(self) -> bytes:
        out = self._close()
        usage = {"input_tokens": self.usage[0], "output_tokens": self.usage[1],
                 "cache_read_input_tokens": self.reused}
        return out + _event("message_delta", delta={"stop_reason": self._stop(), "stop_sequence": None},
                            usage=usage) + _event("message_stop")

    def fail(self, message: str) -> bytes:
        self.open = None
        return _event("error", error={"type": "api_error", "message": message})

    def final(self) -> dict[str, Any]:
        self._close()
        return self._message(content=[_public(b) for b in self.blocks], stop=self._stop())

    def error_body(self, status: int, message: str, kind: str) -> bytes:
        return anthropic_error(status, message)

    def _one(self, e: Event) -> bytes:
        if isinstance(e, Text):
            out = self._ensure("text")
            assert self.open is not None
            self.open["text"] += e.text
            return out + self._delta({"type": "text_delta", "text": e.text})
        if isinstance(e, Reasoning):
            out = self._ensure("thinking")
            assert self.open is not None
            self.open["thinking"] += e.text
            return out + self._delta({"type": "thinking_delta", "thinking": e.text})
        if isinstance(e, ToolStart):
            out = self._close()
            use: dict[str, Any] = {"type": "tool_use", "id": e.id, "name": e.name, "input": {}, "_json": ""}
            self.calls[e.index] = use
            return out + self._start(use)
        if isinstance(e, ToolArgs):
            call = self.calls.get(e.index)
            if call is None:
                return b""
            call["_json"] += e.text
            if call is not self.open:
                return b""
            return self._delta({"type": "input_json_delta", "partial_json": e.text})
        if isinstance(e, Finish):
            self.finish = e.reason
        elif isinstance(e, Usage):
            self.usage = (e.prompt, e.completion)
        return b""

    def _ensure(self, kind: str) -> bytes:
        if self.open is not None and self.open["type"] == kind:
            return b""
        out = self._close()
        block: dict[str, Any] = {"type": "text", "text": ""} if kind == "text" else \
            {"type": "thinking", "thinking": "", "signature": ""}
        return out + self._start(block)

    def _start(self, block: dict[str, Any]) -> bytes:
        self.blocks.append(block)
        self.open = block
        return _event("content_block_start", index=len(self.blocks) - 1, content_block=_public(block, empty=True))

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", index=len(self.blocks) - 1, delta=delta)

    def _close(self) -> bytes:
        block, self.open = self.open, None
        if block is None:
            return b""
        out = b""
        if block["type"] == "thinking":
            out = self._delta({"type": "signature_delta", "signature": ""})
        return out + _event("content_block_stop", index=self.blocks.index(block))

    def _stop(self) -> str | None:
        if self.finish is None:
            return None
        return _STOP.get(self.finish, "end_turn")

    def _message(self, content: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": self.usage[0], "output_tokens": self.usage[1],
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": self.reused}}


def _public(block: dict[str, Any], empty: bool = False) -> dict[str, Any]:
    """A block as the client sees it: a tool_use's input parsed from the arguments text the model wrote."""
    out = {k: v for k, v in block.items() if not k.startswith("_")}
    if block["type"] == "tool_use" and not empty:
        try:
            parsed = json.loads(block["_json"]) if block["_json"].strip() else {}
        except json.JSONDecodeError:
            parsed = {"_raw": block["_json"]}  # the model wrote arguments that are not JSON: keep them visible
        out["input"] = parsed if isinstance(parsed, dict) else {"_value": parsed}
    return out


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + jsonx.dumps({"type": kind, **fields}) + b"\n\n"
