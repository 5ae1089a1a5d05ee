"""Multi-turn streaming conversations through a router in background threads, for tests under change: every
request's fate (ok, failed before its first byte, failed mid-stream), the X-PD-KV-Reuse outcome of turns 2+, and
the simulator's integrity oracle summed over the engines.

A request whose connection closed before any byte of a response came back is sent once more, on a new
connection, as the openai and anthropic SDKs do by default (`max_retries`): a load balancer's reload closes idle
keep-alive connections (HAProxy 2.6's old worker), and a request written onto one at that instant was never
read. Such requests are listed in `Tally.resent`, not as failures; a second close is a failure."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import httpx

from pdctl.router import wire


@dataclass(frozen=True)
class Request:
    """One request's fate: when it started and ended (time.monotonic), and the router that answered it (the
    load balancer's X-PD-Router header; None where no response came or there is no load balancer)."""

    start: float
    end: float
    ok: bool
    router: str | None
    why: str = ""
    ttft: float | None = None  # seconds to the first streamed token
    turn: int = 0


@dataclass
class Tally:
    ok: int = 0
    conversations: int = 0  # whose first turn was answered
    failed: list[str] = field(default_factory=list)  # "<when> <why>" per failed request
    resent: list[str] = field(default_factory=list)  # requests sent again after a close with no response byte
    reuse: Counter[str] = field(default_factory=Counter)  # outcomes of turns 2+
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def hit_rate(self) -> float:
        n = sum(self.reuse.values())
        return (self.reuse["hit"] + self.reuse["partial"]) / n if n else 0.0


class Load:
    """`streams` conversations of `turns` turns each, restarted until `stop()`."""

    def __init__(self, url: str, streams: int = 4, turns: int = 4, max_tokens: int = 8, think_s: float = 0.05) -> None:
        self.url, self.turns, self.max_tokens, self.think_s = url, turns, max_tokens, think_s
        self.tally = Tally()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(streams)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> Tally:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        return self.tally

    def wait_requests(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        start = self.tally.ok
        while self.tally.ok - start < n and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_conversations(self, n: int, timeout: float = 60.0) -> None:
        """Until `n` conversations in all have had their first turn answered (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while self.tally.conversations < n and time.monotonic() < deadline:
            time.sleep(0.1)

    def _run(self) -> None:
        with httpx.Client(timeout=60.0) as client:
            while not self._stop.is_set():
                cid = f"h30-{uuid.uuid4().hex[:12]}"
                messages: list[dict[str, str]] = []
                for turn in range(self.turns):
                    if self._stop.is_set():
                        return
                    messages.append({"role": "user", "content": f"turn {turn} of {cid}: " + "tell me more " * 12})
                    text = self._turn(client, cid, messages, turn)
                    if text is None:
                        break
                    messages.append({"role": "assistant", "content": text})
                    time.sleep(self.think_s)

    def _turn(self, client: httpx.Client, cid: str, messages: list[dict[str, str]], turn: int) -> str | None:
        try:
            return self._send(client, cid, messages, turn, resend=True)
        except _Closed as closed:
            with self.tally.lock:
                self.tally.resent.append(str(closed))
            return self._send(client, cid, messages, turn, resend=False)

    def _send(self, client: httpx.Client, cid: str, messages: list[dict[str, str]], turn: int,
              resend: bool) -> str | None:
        body = {"model": "Qwen", "messages": messages, "max_tokens": self.max_tokens, "stream": True}
        parts: list[str] = []
        started = answered = False
        t0, router, first = time.monotonic(), None, None
        try:
            with client.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                               headers={"x-conversation-id": cid}) as r:
                answered = True
                if r.status_code != 200:
                    r.read()
                    return self._failed(t0, router, f"before HTTP {r.status_code} {r.text[:200]}")
                router = r.headers.get("x-pd-router")
                outcome = wire.Reuse.parse(r.headers.get(wire.REUSE_HEADER)).outcome
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    if not started:
                        first = time.monotonic() - t0
                    started = True
                    event = json.loads(line[6:])
                    if "error" in event:
                        return self._failed(t0, router, f"mid-stream error event {event['error']}")
                    for c in event.get("choices") or ():
                        parts.append((c.get("delta") or {}).get("content") or "")
        except (httpx.RemoteProtocolError, httpx.ConnectError) as exc:
            if resend and not answered:  # closed with no response: the request was not read
                raise _Closed(f"{type(exc).__name__}: {exc}") from exc
            return self._failed(t0, router, f"{'mid-stream' if started else 'before'} {type(exc).__name__}")
        except httpx.HTTPError as exc:
            return self._failed(t0, router, f"{'mid-stream' if started else 'before'} {type(exc).__name__}")
        with self.tally.lock:
            self.tally.ok += 1
            self.tally.conversations += turn == 0
            self.tally.requests.append(Request(t0, time.monotonic(), True, router, ttft=first, turn=turn))
            if turn:
                self.tally.reuse[outcome] += 1
        return "".join(parts)

    def _failed(self, t0: float, router: str | None, why: str) -> None:
        with self.tally.lock:
            self.tally.failed.append(why)
            self.tally.requests.append(Request(t0, time.monotonic(), False, router, why))
        return None


class _Closed(Exception):
    """The connection closed before any byte of a response: the request may be sent again."""


def corrupt_reuses(urls: list[str], key: str) -> float:
    """The simulator's oracle (`pdctl_sim_corrupt_reuse_total`) summed over the engines at `urls`."""
    total = 0.0
    with httpx.Client(timeout=5.0, headers={"authorization": f"Bearer {key}"}) as client:
        for url in urls:
            for line in client.get(f"{url}/metrics").text.splitlines():
                if line.startswith("pdctl_sim_corrupt_reuse_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total
