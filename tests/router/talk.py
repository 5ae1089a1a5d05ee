"""A tiny OpenAI client for the router tests: one turn of a chat or completions conversation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    raw: bytes
    text: str
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reuse(self) -> str:
        return self.headers.get("x-pd-kv-reuse", "")

    @property
    def outcome(self) -> str:
        return self.reuse.split(";")[0]

    @property
    def reason(self) -> str:
        return self.reuse.rsplit("reason=", 1)[-1]


def send(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    chat = "messages" in body
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not body.get("stream"):
        r = client.post(url + path, json=body, headers=headers)
        text = ""
        if r.status_code == 200:
            choice = r.json()["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
        return Reply(r.status_code, r.headers, r.content, text)
    with client.stream("POST", url + path, json=body, headers=headers) as r:
        raw = r.read()
    events = [json.loads(line[6:]) for line in raw.decode().split("\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    parts = []
    for e in events:
        for c in e.get("choices") or ():
            parts.append((c.get("delta") or {}).get("content") or "" if chat else c.get("text") or "")
    return Reply(r.status_code, r.headers, raw, "".join(parts), events)


class Conversation:
    """Turns of one conversation; `mode` says how the router learns which one: body, header, or derived."""

    def __init__(self, url: str, chat: bool, stream: bool, mode: str, cid: str, max_tokens: int = 12,
                 **extra: Any) -> None:
        self.url, self.chat, self.stream, self.mode, self.cid = url, chat, stream, mode, cid
        self.max_tokens = max_tokens
        self.extra = extra
        self.messages: list[dict[str, Any]] = []
        self.prompt = ""
        self.client = httpx.Client(timeout=30)

    def body(self, user: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "Qwen", "max_tokens": self.max_tokens, "stream": self.stream, **self.extra}
        if self.chat:
            body["messages"] = [*self.messages, {"role": "user", "content": user}]
        else:
            body["prompt"] = self.prompt + user
        if self.mode == "body":
            body["conversation_id"] = self.cid
        return body

    def headers(self) -> dict[str, str]:
        return {"X-Session-ID": self.cid} if self.mode == "header" else {}

    def turn(self, user: str) -> Reply:
        body = self.body(user)
        reply = send(self.client, self.url, body, self.headers())
        if reply.status == 200:
            self.accept(body, reply.text)
        return reply

    def accept(self, body: dict[str, Any], text: str) -> None:
        if self.chat:
            self.messages = [*body["messages"], {"role": "assistant", "content": text}]
        else:
            self.prompt = body["prompt"] + text
