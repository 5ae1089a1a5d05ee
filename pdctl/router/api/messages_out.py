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
from pdctl.router.api.chatstream import ToolStart
from pdctl.router.api.rendering import TurnRenderer
from pdctl.router.errors import anthropic_error

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessagesRenderer(TurnRenderer):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.id = f"msg_{uuid.uuid4().hex}"

    def start(self) -> bytes:
        message = self._message(content=[], stop=None)
        return _event("message_start", message=message) + _event("ping")

    def end(self) -> bytes:
        out = self._close()
        prompt, completion = self.usage or (0, 0)
        usage = {"input_tokens": prompt, "output_tokens": completion, "cache_read_input_tokens": self.reused}
        return out + _event("message_delta", delta={"stop_reason": self._stop(), "stop_sequence": None},
                            usage=usage) + _event("message_stop")

    def fail(self, message: str) -> bytes:
        self.open = None
        return _event("error", error={"type": "api_error", "message": message})

    def final(self) -> dict[str, Any]:
        self._close()
        return self._message(content=[_public(b) for b in self.outputs], stop=self._stop())

    def error_body(self, status: int, message: str, kind: str) -> bytes:
        return anthropic_error(status, message)

    # -- content blocks -------------------------------------------------------------------------------------
    def _text(self, text: str) -> bytes:
        out, block = self._ensure("text")
        block["text"] += text
        return out + self._delta({"type": "text_delta", "text": text})

    def _reasoning(self, text: str) -> bytes:
        out, block = self._ensure("thinking")
        block["thinking"] += text
        return out + self._delta({"type": "thinking_delta", "thinking": text})

    def _call(self, start: ToolStart) -> dict[str, Any]:
        return {"type": "tool_use", "id": start.id, "name": start.name, "input": {}, "_json": ""}

    def _args(self, call: dict[str, Any], text: str) -> bytes:
        call["_json"] += text
        if call is not self.open:
            return b""
        return self._delta({"type": "input_json_delta", "partial_json": text})

    def _new(self, kind: str) -> dict[str, Any]:
        return {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}

    def _started(self, block: dict[str, Any]) -> bytes:
        return _event("content_block_start", index=self._index(), content_block=_public(block, empty=True))

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", index=self._index(), delta=delta)

    def _closed(self, block: dict[str, Any]) -> bytes:
        out = b""
        if block["type"] == "thinking":
            out = self._delta({"type": "signature_delta", "signature": ""})
        return out + _event("content_block_stop", index=self.outputs.index(block))

    def _stop(self) -> str | None:
        if self.finish is None:
            return None
        return _STOP.get(self.finish, "end_turn")

    def _message(self, content: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
        prompt, completion = self.usage or (0, 0)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": prompt, "output_tokens": completion,
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
