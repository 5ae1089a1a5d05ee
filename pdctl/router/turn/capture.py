"""Reading a decode's output: what the router keeps (new handle, token ids, reply) and what the client sees.

Works chunk by chunk for streams and once for whole bodies. Only choice 0 is tracked. The client never sees
`kv_transfer_params`; it sees `prompt_token_ids`/`token_ids` only if it asked for them itself.
"""

from __future__ import annotations

from typing import Any

from pdctl.router.jsonx import DecodeError, dumps, loads
from pdctl.router.upstream.sse import SseEvents


class Capture:
    def __init__(self, chat: bool, keep_ids: bool, cached: int | None = None,
                 cached_default: int | None = None) -> None:
        self.chat = chat
        self.keep_ids = keep_ids
        self.cached, self.cached_default = cached, cached_default
        self.params: dict[str, Any] | None = None
        self.prompt_ids: list[int] | None = None
        self.output_ids: list[int] = []
        self.ids_seen = False
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finished = False

    def take(self, obj: dict[str, Any], whole: bool = False) -> None:
        """Record one parsed chunk (or a whole body) and strip what the client must not see, in place.

        Called for every SSE event of every streamed reply: keys are tested with `in` before they are popped or
        read (most events carry neither a handle nor usage), which costs less than a pop/get call for each."""
        if "kv_transfer_params" in obj:
            params = obj.pop("kv_transfer_params")
            if isinstance(params, dict):
                self.params = params
        if "prompt_token_ids" in obj:
            top = obj["prompt_token_ids"] if self.keep_ids else obj.pop("prompt_token_ids")
            if isinstance(top, list):
                self.prompt_ids = top
        usage = obj.get("usage")
        if usage is not None and isinstance(usage, dict):
            self._usage(usage)
        keep_ids = self.keep_ids
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            prompt = ids = None
            if "prompt_token_ids" in choice:
                prompt = choice["prompt_token_ids"] if keep_ids else choice.pop("prompt_token_ids")
            if "token_ids" in choice:
                ids = choice["token_ids"] if keep_ids else choice.pop("token_ids")
            if "index" in choice and choice["index"] != 0:
                continue
            if prompt is not None and isinstance(prompt, list):
                self.prompt_ids = prompt
            if ids is not None and isinstance(ids, list):
                self.ids_seen = True
                self.output_ids.extend(ids)
            if choice.get("finish_reason") is not None:
                self.finished = True
            if not self.chat:
                text = choice.get("text")
                if isinstance(text, str):
                    self.text.append(text)
            else:
                self._reply(choice, whole)

    def _usage(self, usage: dict[str, Any]) -> None:
        """The client's cached tokens, as vLLM reports them: the decode's own figure counts the prefill's KV it
        pulled, which the client's prompt did not find cached; the turn's figure replaces it."""
        details = usage.get("prompt_tokens_details")
        own = details.get("cached_tokens") if isinstance(details, dict) else None
        cached = self.cached
        if cached is None and not isinstance(own, int):
            cached = self.cached_default
        if cached is not None:
            usage["prompt_tokens_details"] = {**(details if isinstance(details, dict) else {}),
                                              "cached_tokens": cached}

    def _reply(self, choice: dict[str, Any], whole: bool) -> None:
        if not self.chat:
            text = choice.get("text")
            if isinstance(text, str):
                self.text.append(text)
            return
        part = choice.get("message" if whole else "delta")
        if not isinstance(part, dict):
            return
        content = part.get("content")
        if isinstance(content, str):
            self.text.append(content)
        for call in part.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            slot = self.calls.setdefault(int(call.get("index", len(self.calls)) or 0), {"name": "", "arguments": ""})
            fn = call.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""

    def reply(self) -> dict[str, Any]:
        """The assistant turn as the client will send it back (content, tool calls)."""
        out: dict[str, Any] = {"content": "".join(self.text)}
        if self.calls:
            out["tool_calls"] = [{"function": self.calls[i]} for i in sorted(self.calls)]
        return out

    def held_tokens(self) -> list[int] | None:
        """The token ids the decode's blocks hold: prompt + output, cut at its remote_num_tokens."""
        n = (self.params or {}).get("remote_num_tokens")
        if self.prompt_ids is None or not self.ids_seen or not isinstance(n, int):
            return None
        seq = self.prompt_ids + self.output_ids
        return seq[:n] if len(seq) >= n else None


    def computed_tokens(self) -> list[int] | None:
        """The ids whose KV a request the decode ran alone left in its cache: the prompt and every output token but
        the last, which was sampled and never fed back (no handle comes back for such a request)."""
        if self.prompt_ids is None or not self.ids_seen:
            return None
        return self.prompt_ids + self.output_ids[:-1]


class SseRewriter:
    """Splits a decode's SSE byte stream into events, feeds each to a Capture, re-emits the stripped event."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self._events = SseEvents()
        self.done = False  # the stream's `[DONE]` went by: the capture is whole

    def feed(self, data: bytes) -> bytes:
        return b"".join([self._event(e) for e in self._events.feed(data)])

    def flush(self) -> bytes:
        return b"".join([self._event(e) for e in self._events.rest()])

    def _event(self, event: bytes) -> bytes:
        event = event.strip(b"\r\n")
        if not event.startswith(b"data:"):
            return event + b"\n\n"
        if event.endswith(b"[DONE]"):
            self.done = True
            return event + b"\n\n"
        try:
            obj = loads(event[5:])
        except DecodeError:
            return event + b"\n\n"
        if not isinstance(obj, dict):
            return event + b"\n\n"
        self.capture.take(obj)
        if (b"kv_transfer_params" in event or (not self.capture.keep_ids and b"token_ids" in event)
                or b'"prompt_tokens"' in event):  # usage: take() set the client's cached_tokens in it
            return b"data: " + dumps(obj) + b"\n\n"
        return event + b"\n\n"  # take() stripped nothing: the event's own bytes, not serialised again
