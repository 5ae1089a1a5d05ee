"""Multi-turn conversations for a prompt-length sweep, deterministic from a seed.

Each conversation starts with `length` tokens of history (turn 0) and every later turn appends the reply the
engine actually produced plus a new user message of `user_tokens` tokens, so turn k+1's prompt is exactly turn
k's prompt followed by the reply and the new message (the property bidirectional KV reuse depends on).
Chat prompts are text from a corpus (generated, or a text file / ShareGPT JSON) sized with a tokens-per-word
ratio measured on the engine's `/tokenize`; token-id prompts go to `/v1/completions` as the anchor run did.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pdctl.errors import UsageError

Api = Literal["chat", "completions", "responses", "messages"]
TEXT_APIS = ("chat", "responses", "messages")  # the APIs whose conversations are text messages
Segment = str | tuple[int, ...]

DEFAULT_LENGTHS = (2000, 4000, 8000, 12000, 16000, 20000, 24000)
_SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "vu", "ga", "be", "zo", "fi", "ha", "ju")
TOKEN_ID_LOW = 1000


@dataclass(frozen=True)
class WorkloadSpec:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    conversations: int = 10
    turns: int = 10
    user_tokens: int = 150
    output_tokens: int = 300
    api: Api = "chat"
    seed: int = 0
    source: Path | None = None
    tokens_per_word: float = 1.0
    token_id_high: int = 30000

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise UsageError(f"bad lengths {self.lengths}", hint="pass positive token counts, e.g. --lengths 2000,8000")
        for name in ("conversations", "turns", "user_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ConversationPlan:
    """The fixed parts of one conversation: its history and the user messages of later turns."""

    key: str
    length: int
    index: int
    first: Segment
    users: tuple[Segment, ...]

    @property
    def turns(self) -> int:
        return 1 + len(self.users)


def build(spec: WorkloadSpec) -> list[ConversationPlan]:
    """Every conversation of the sweep, lengths in the given order, the same for every leg."""
    rng = random.Random(spec.seed)
    words = _corpus_words(spec.source) if spec.api in TEXT_APIS else []
    cursor = _Cursor(words, rng)
    plans = []
    for length in spec.lengths:
        for i in range(spec.conversations):
            key = f"L{length}-c{i}"
            if spec.api in TEXT_APIS:
                header = f"Conversation {key} seed {spec.seed}."
                first: Segment = f"{header} {cursor.text(_words_for(length, spec) - len(header.split()))}"
                users: tuple[Segment, ...] = tuple(
                    cursor.text(_words_for(spec.user_tokens, spec)) for _ in range(spec.turns - 1)
                )
            else:
                first = _ids(rng, length, spec.token_id_high)
                users = tuple(_ids(rng, spec.user_tokens, spec.token_id_high) for _ in range(spec.turns - 1))
            plans.append(ConversationPlan(key, length, i, first, users))
    return plans


@dataclass
class Conversation:
    """One conversation being played: builds each turn's request body and grows with the replies."""

    plan: ConversationPlan
    api: Api
    conversation_id: str
    turn: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.api in TEXT_APIS:
            self.messages = [{"role": "user", "content": str(self.plan.first)}]
        else:
            self.prompt_ids = list(_as_ids(self.plan.first))

    @property
    def done(self) -> bool:
        return self.turn >= self.plan.turns

    def body(self, model: str, output_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "conversation_id": self.conversation_id,
        }
        if self.api == "responses":  # the same turn in the Responses API's words
            del body["max_tokens"], body["stream_options"]
            body["max_output_tokens"] = output_tokens
            body["input"] = [dict(m) for m in self.messages]
        elif self.api in TEXT_APIS:
            body["messages"] = [dict(m) for m in self.messages]
            if self.api == "messages":
                del body["stream_options"]
        else:
            body["prompt"] = list(self.prompt_ids)
            body["return_token_ids"] = True
        return body

    def advance(self, reply_text: str, reply_ids: list[int]) -> None:
        """Append this turn's reply and the next user message; the old prompt stays an exact prefix."""
        self.turn += 1
        if self.done:
            return
        nxt = self.plan.users[self.turn - 1]
        if self.api in TEXT_APIS:
            self.messages.append({"role": "assistant", "content": reply_text})
            self.messages.append({"role": "user", "content": str(nxt)})
        else:
            self.prompt_ids.extend(reply_ids)
            self.prompt_ids.extend(_as_ids(nxt))


def _words_for(tokens: int, spec: WorkloadSpec) -> int:
    return max(1, round(tokens / spec.tokens_per_word))


def _ids(rng: random.Random, n: int, high: int) -> tuple[int, ...]:
    return tuple(rng.randrange(TOKEN_ID_LOW, high) for _ in range(n))


def _as_ids(segment: Segment) -> tuple[int, ...]:
    if isinstance(segment, str):
        raise TypeError("a chat segment in a token-id conversation")
    return segment


class _Cursor:
    """Hands out consecutive, non-overlapping windows of a word list (generated words when it is empty)."""

    def __init__(self, words: list[str], rng: random.Random) -> None:
        self.words = words
        self.rng = rng
        self.pos = 0
        self.vocab = _vocabulary()

    def text(self, n: int) -> str:
        return " ".join(self._take(max(1, n)))

    def _take(self, n: int) -> Iterator[str]:
        for _ in range(n):
            if self.words:
                yield self.words[self.pos % len(self.words)]
                self.pos += 1
            else:
                yield self.rng.choice(self.vocab)


def _vocabulary(size: int = 4000) -> list[str]:
    """A fixed made-up vocabulary, so generated text needs no download and is the same everywhere."""
    rng = random.Random(1184)
    words = {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(size * 2)}
    return sorted(words)[:size]


def _corpus_words(source: Path | None) -> list[str]:
    if source is None:
        return []
    try:
        raw = source.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read corpus {source}: {exc.strerror}", hint="pass an existing file") from None
    text = _sharegpt_text(raw, source) if source.suffix == ".json" else raw
    words = text.split()
    if len(words) < 100:
        raise UsageError(
            f"corpus {source} has only {len(words)} words",
            hint="give a longer text file or ShareGPT JSON, or leave --input out to use the generated corpus",
        )
    return words


def _sharegpt_text(raw: str, source: Path) -> str:
    """Every message's text from ShareGPT (`conversations`/`from`/`value`) or OpenAI (`messages`) JSON."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    items = data if isinstance(data, list) else [data]
    parts: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        for msg in item.get("conversations") or item.get("messages") or []:
            if isinstance(msg, dict):
                value = msg.get("value", msg.get("content"))
                if isinstance(value, str):
                    parts.append(value)
    if not parts:
        raise UsageError(
            f"{source}: no messages found",
            hint='expected [{"conversations": [{"from": "human", "value": "..."}]}] or [{"messages": [...]}]',
        )
    return "\n".join(parts)
