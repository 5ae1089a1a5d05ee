"""A deterministic word-level tokenizer and chat template, shaped like pdctl's dummy Qwen3 model.

Text is split on whitespace (special tokens split out first): every word is one token. A word of the English
vocabulary (pdctl.sim.vocab: lowercased, attached punctuation dropped) is its id there; the word `w<i>` is id i;
the specials keep Qwen3's ids; `<unk>` is 151646; any other word gets a stable id from a CRC. Generated ids decode
to the vocabulary's words (or `w<i>`), so generated text re-tokenizes to the same ids, and the Hugging Face
tokenizer pdctl writes for clients (pdctl.sim.model_dir) counts every text as the simulator does. The chat
template is ChatML rendered to ids, so the rendering of a history is a strict prefix of the rendering of that
history plus more messages.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

from pdctl.sim import vocab

VOCAB_SIZE = 151936
ENDOFTEXT, IM_START, IM_END, UNK = 151643, 151644, 151645, 151646
THINK_START, THINK_END = 151667, 151668
TOOL_CALL_START, TOOL_CALL_END = 151657, 151658
SPECIALS = {"<|endoftext|>": ENDOFTEXT, "<|im_start|>": IM_START, "<|im_end|>": IM_END, "<unk>": UNK,
            "<think>": THINK_START, "</think>": THINK_END, "<tool_call>": TOOL_CALL_START,
            "</tool_call>": TOOL_CALL_END}
SPECIAL_TEXT = {i: t for t, i in SPECIALS.items()}
# Ids drawn for generated words stay clear of the specials and of small ids that prompts tend to use.
GEN_LOW, GEN_HIGH = 1000, 150000

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
_WORD_ID_RE = re.compile(r"w(\d{1,6})")


@functools.lru_cache(maxsize=1 << 17)  # the regex and CRC per word made a 24k-token render cost ~30 ms of CPU
def word_id(word: str) -> int:
    special = SPECIALS.get(word)
    if special is not None:
        return special
    norm = vocab.normalize(word)  # as the Hugging Face tokenizer's normalizer: "W5," is w5, "Hello," hello
    m = _WORD_ID_RE.fullmatch(norm)
    if m and int(m.group(1)) < VOCAB_SIZE and int(m.group(1)) not in SPECIAL_TEXT:
        return int(m.group(1))
    known = vocab.ids().get(norm)
    if known is not None:
        return known
    return GEN_LOW + zlib.crc32(word.encode("utf-8")) % (GEN_HIGH - GEN_LOW)


def encode(text: str) -> list[int]:
    ids: list[int] = []
    for part in _SPECIAL_RE.split(text):
        if part in SPECIALS:
            ids.append(SPECIALS[part])
        elif part:
            ids.extend(word_id(w) for w in part.split())
    return ids


def token_str(token_id: int) -> str:
    return SPECIAL_TEXT.get(token_id) or vocab.word(token_id) or f"w{token_id}"


def unknown_share(ids: Sequence[int]) -> float:
    """The share of a prompt's tokens that are `<unk>`: text a client's tokenizer did not know, sent as `<unk>`."""
    return ids.count(UNK) / len(ids) if ids else 0.0


def decode_piece(token_id: int) -> str:
    """The text one generated token adds to the output (a leading space separates words)."""
    return " " + token_str(token_id)


def decode(ids: Iterable[int]) -> str:
    return "".join(decode_piece(i) for i in ids)


def tool_call_ids(name: str, arguments: str) -> list[int]:
    """A tool call as the model writes it (hermes style): `<tool_call> name arguments </tool_call>`."""
    return [TOOL_CALL_START, *encode(name), *encode(arguments), TOOL_CALL_END]


def render_chat(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """ChatML as ids: `<|im_start|> role content [tool calls] <|im_end|>` per message, then
    `<|im_start|> assistant`."""
    ids: list[int] = []
    for message in messages:
        ids.append(IM_START)
        ids.extend(encode(str(message.get("role", ""))))
        ids.extend(encode(content_text(message.get("content"))))
        for call in message.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                ids.extend(tool_call_ids(str(fn.get("name", "")), str(fn.get("arguments", ""))))
        ids.append(IM_END)
    if add_generation_prompt:
        ids.append(IM_START)
        ids.extend(encode("assistant"))
    return ids


def content_text(content: Any) -> str:
    """OpenAI content: a string, None, or a list of parts of which the text parts count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def generate(prompt: Sequence[int], n: int, thinking: bool = False) -> list[int]:
    """n deterministic output ids for a prompt; with `thinking` they open with a `<think>...</think>` block."""
    seed = zlib.crc32(b"".join(t.to_bytes(4, "little") for t in prompt[-64:])) ^ len(prompt)
    out: list[int] = []
    x = seed or 1
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(GEN_LOW + (x >> 33) % (GEN_HIGH - GEN_LOW))
    if thinking and n >= 2:
        think_len = min(max(n // 4, 0), n - 2)
        out[0] = THINK_START
        out[think_len + 1] = THINK_END
    return out
