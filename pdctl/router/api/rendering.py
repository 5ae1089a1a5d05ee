"""The skeleton both agent-API renderers share: a turn's outputs built from chatstream events, one open at a time.

An output is a Messages content block or a Responses output item, held as the dict the API returns. Text and
reasoning go to the open output of their kind, or close it and start one; a tool call always starts its own, and
its argument deltas reach it by index even after it closed. What each API emits for an output is its own
(messages_out.py, responses_out.py); when they happen is written here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from pdctl.router.api.chatstream import Event, Finish, Reasoning, Text, ToolArgs, ToolStart, Usage


class TurnRenderer(ABC):
    def __init__(self) -> None:
        self.reused = 0
        self.outputs: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: tuple[int, int] | None = None

    def feed(self, events: list[Event]) -> bytes:
        return b"".join(self._one(e) for e in events)

    def _one(self, e: Event) -> bytes:
        if isinstance(e, Text):
            return self._text(e.text)
        if isinstance(e, Reasoning):
            return self._reasoning(e.text)
        if isinstance(e, ToolStart):
            out = self._close()
            call = self._call(e)
            self.calls[e.index] = call
            return out + self._start(call)
        if isinstance(e, ToolArgs):
            known = self.calls.get(e.index)
            return b"" if known is None else self._args(known, e.text)
        if isinstance(e, Finish):
            self.finish = e.reason
        elif isinstance(e, Usage):
            self.usage = (e.prompt, e.completion)
            if e.cached is not None:  # the turn's own figure (the router's chat usage) over the header's
                self.reused = e.cached
        return b""

    def _ensure(self, kind: str) -> tuple[bytes, dict[str, Any]]:
        """The open output if it is of this kind; otherwise the open one closed and a new one of the kind started."""
        if self.open is not None and self.open["type"] == kind:
            return b"", self.open
        out = self._close()
        output = self._new(kind)
        return out + self._start(output), output

    def _start(self, output: dict[str, Any]) -> bytes:
        self.outputs.append(output)
        self.open = output
        return self._started(output)

    def _close(self) -> bytes:
        output, self.open = self.open, None
        return b"" if output is None else self._closed(output)

    def _index(self) -> int:
        return len(self.outputs) - 1

    @abstractmethod
    def _text(self, text: str) -> bytes: ...

    @abstractmethod
    def _reasoning(self, text: str) -> bytes: ...

    @abstractmethod
    def _call(self, start: ToolStart) -> dict[str, Any]:
        """A new tool-call output, not yet started."""

    @abstractmethod
    def _args(self, call: dict[str, Any], text: str) -> bytes: ...

    @abstractmethod
    def _new(self, kind: str) -> dict[str, Any]:
        """A new text or reasoning output of the API's `kind`, not yet started."""

    @abstractmethod
    def _started(self, output: dict[str, Any]) -> bytes: ...

    @abstractmethod
    def _closed(self, output: dict[str, Any]) -> bytes: ...
