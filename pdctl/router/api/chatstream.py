"""A chat completion's answer as neutral events, so that each agent API renders it once for both shapes.

A whole `chat.completion` body and the chunks of a streamed one produce the same sequence:
    Reasoning(text)*  Text(text)*  ToolStart(index, id, name) ToolArgs(index, text)*  Finish(reason)  Usage(...)
Only choice 0 is read (agent APIs have no `n`). `reasoning` / `reasoning_content` come from vLLM's reasoning
parser when the engine runs one; the text is left as the engine sent it otherwise.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from pdctl.router.wire import REUSE_HEADER, Reuse


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolArgs:
    index: int
    text: str


@dataclass(frozen=True)
class Finish:
    reason: str


@dataclass(frozen=True)
class Usage:
    prompt: int
    completion: int
    cached: int | None = None  # prompt_tokens_details.cached_tokens, where the answer has them


Event = Reasoning | Text | ToolStart | ToolArgs | Finish | Usage


def _reasoning(part: dict[str, Any]) -> str:
    value = part.get("reasoning")
    if not isinstance(value, str):
        value = part.get("reasoning_content")
    return value if isinstance(value, str) else ""


@dataclass
class ChatReader:
    """Turns chat chunks (or one whole body) into events; remembers the model and the tool calls it opened."""

    model: str = ""
    opened: set[int] = field(default_factory=set)

    def whole(self, body: dict[str, Any]) -> list[Event]:
        return self._read(body, "message")

    def chunk(self, obj: dict[str, Any]) -> list[Event]:
        return self._read(obj, "delta")

    def _read(self, obj: dict[str, Any], part: str) -> list[Event]:
        """A body's choice 0 `message`, or a chunk's `delta`: the same fields, whole or in pieces."""
        self.model = str(obj.get("model") or self.model)
        choice = _choice0(obj)
        out: list[Event] = []
        if choice is not None:
            given = choice.get(part) or {}
            if isinstance(given, dict):
                out += self._part(given)
            if choice.get("finish_reason") is not None:
                out.append(Finish(str(choice["finish_reason"])))
        out += _usage(obj)
        return out

    def _part(self, part: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        thought = _reasoning(part)
        if thought:
            out.append(Reasoning(thought))
        content = part.get("content")
        if isinstance(content, str) and content:
            out.append(Text(content))
        for n, call in enumerate(part.get("tool_calls") or ()):
            if not isinstance(call, dict):
                continue
            index = call.get("index", n)
            index = index if isinstance(index, int) else n
            raw = call.get("function")
            fn: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if index not in self.opened:
                self.opened.add(index)
                given = call.get("id")
                call_id = given if isinstance(given, str) else f"call_{uuid.uuid4().hex[:24]}"
                out.append(ToolStart(index, call_id, str(fn.get("name") or "")))
            args = fn.get("arguments")
            if isinstance(args, str) and args:
                out.append(ToolArgs(index, args))
        return out


def _choice0(obj: dict[str, Any]) -> dict[str, Any] | None:
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _usage(obj: dict[str, Any]) -> list[Event]:
    u = obj.get("usage")
    if not isinstance(u, dict):
        return []
    prompt, completion = u.get("prompt_tokens"), u.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return []
    details = u.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return [Usage(prompt, completion, cached if isinstance(cached, int) else None)]


def reused_tokens(headers: list[tuple[bytes, bytes]]) -> int:
    """The prompt tokens the router reused this turn (from its X-PD-KV-Reuse header): the APIs' cached tokens."""
    for k, v in headers:
        if k.lower() == REUSE_HEADER.encode():
            return Reuse.parse(v.decode("latin-1")).tokens
    return 0
