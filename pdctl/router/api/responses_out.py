"""A turn rendered as the Responses API answers it: the `response` object, or its event stream.

Streamed, the events come in the order OpenAI sends them, each with a `sequence_number`:
    response.created, response.in_progress,
    per output item: response.output_item.added, then for a message response.content_part.added,
    response.output_text.delta*, response.output_text.done, response.content_part.done; for a function call
    response.function_call_arguments.delta*, .done; for reasoning response.reasoning_text.delta*, .done;
    then response.output_item.done,
    response.completed (status "incomplete" when max_output_tokens cut it short, as vLLM sends it).
A decode failure mid-stream ends it with an `error` event and response.failed.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pdctl.router import jsonx
from pdctl.router.api.chatstream import ToolStart
from pdctl.router.api.rendering import TurnRenderer
from pdctl.router.errors import error_body

# Request fields a response object echoes back.
ECHO = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "previous_response_id",
        "temperature", "tool_choice", "tools", "top_p", "truncation", "user", "store", "reasoning", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesRenderer(TurnRenderer):
    def __init__(self, request: dict[str, Any], model: str, response_id: str) -> None:
        super().__init__()
        self.request = request
        self.model = model
        self.id = response_id
        self.created = int(time.time())
        self.seq = 0

    # -- the Renderer protocol ----------------------------------------------------------------------------
    def start(self) -> bytes:
        return self._emit("response.created", response=self._object("in_progress")) + \
            self._emit("response.in_progress", response=self._object("in_progress"))

    def end(self) -> bytes:
        out = self._close()
        # As vLLM does: a cut-short response still ends in response.completed (its status says incomplete), which
        # is the one end event the SDKs' stream helpers accept.
        return out + self._emit("response.completed", response=self._object(self._status()))

    def fail(self, message: str) -> bytes:
        self.open = None
        return self._emit("error", code="upstream_error", message=message, param=None) + \
            self._emit("response.failed", response=self._object("failed", error={"code": "server_error",
                                                                                  "message": message}))

    def final(self) -> dict[str, Any]:
        self._close()
        return self._object(self._status())

    def error_body(self, status: int, message: str, kind: str) -> bytes:
        return error_body(status, message, kind)

    # -- output items ---------------------------------------------------------------------------------------
    def _text(self, text: str) -> bytes:
        out, item = self._ensure("message")
        item["content"][0]["text"] += text
        return out + self._emit("response.output_text.delta", item_id=item["id"], output_index=self._index(),
                                content_index=0, delta=text, logprobs=[])

    def _reasoning(self, text: str) -> bytes:
        out, item = self._ensure("reasoning")
        item["content"][0]["text"] += text
        return out + self._emit("response.reasoning_text.delta", item_id=item["id"], output_index=self._index(),
                                content_index=0, delta=text)

    def _call(self, start: ToolStart) -> dict[str, Any]:
        return {"id": new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": start.id,
                "name": start.name, "arguments": ""}

    def _args(self, call: dict[str, Any], text: str) -> bytes:
        call["arguments"] += text
        return self._emit("response.function_call_arguments.delta", item_id=call["id"],
                          output_index=self.outputs.index(call), delta=text)

    def _new(self, kind: str) -> dict[str, Any]:
        if kind == "message":
            return {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
        return {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "encrypted_content": None,
                "status": "in_progress"}

    def _started(self, item: dict[str, Any]) -> bytes:
        out = self._emit("response.output_item.added", output_index=self._index(), item=_copy(item))
        if item["type"] == "message":
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
            item["content"].append(part)
            out += self._emit("response.content_part.added", item_id=item["id"], output_index=self._index(),
                              content_index=0, part=_copy(part))
        elif item["type"] == "reasoning":
            item["content"].append({"type": "reasoning_text", "text": ""})
        return out

    def _closed(self, item: dict[str, Any]) -> bytes:
        item["status"] = "completed"
        n = self.outputs.index(item)
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            out += self._emit("response.output_text.done", item_id=item["id"], output_index=n, content_index=0,
                              text=part["text"], logprobs=[])
            out += self._emit("response.content_part.done", item_id=item["id"], output_index=n, content_index=0,
                              part=part)
        elif item["type"] == "reasoning":
            out += self._emit("response.reasoning_text.done", item_id=item["id"], output_index=n, content_index=0,
                              text=item["content"][0]["text"])
        else:
            out += self._emit("response.function_call_arguments.done", item_id=item["id"], output_index=n,
                              name=item["name"], arguments=item["arguments"])
        return out + self._emit("response.output_item.done", output_index=n, item=item)

    def _status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def _object(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        req = self.request
        obj: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "background": False, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model, "output": [_copy(i) for i in self.outputs],
        }
        obj.update({k: req.get(k) for k in ECHO})
        obj["parallel_tool_calls"] = req.get("parallel_tool_calls", True)
        obj["tool_choice"] = req.get("tool_choice", "auto")
        obj["tools"] = req.get("tools") or []
        obj["store"] = req.get("store", True) is not False
        obj["text"] = req.get("text") or {"format": {"type": "text"}}
        obj["truncation"] = req.get("truncation") or "disabled"
        obj["metadata"] = req.get("metadata") or {}
        if status in ("completed", "incomplete") and self.usage is not None:
            prompt, completion = self.usage
            obj["usage"] = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": self.reused},
                            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": prompt + completion}
        else:
            obj["usage"] = None
        return obj

    def _emit(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + jsonx.dumps(data) + b"\n\n"


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return jsonx.loads(jsonx.dumps(item))  # type: ignore[no-any-return]


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages that continue its history (for previous_response_id)."""
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for item in items:
        if item["type"] == "message":
            msg["content"] += "".join(p.get("text", "") for p in item["content"])
        elif item["type"] == "reasoning":
            msg["reasoning"] = "".join(p.get("text", "") for p in item["content"])
        elif item["type"] == "function_call":
            msg.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item["arguments"]}})
    return [msg]
