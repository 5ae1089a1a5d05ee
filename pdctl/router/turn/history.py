"""What a handle's decode last ran, and how much a new request adds to it, known without tokenizing the prompt.

How many tokens it adds is learned from the engines themselves (issue 29): the decode's answer carries the token
ids of the turn it ran (its prompt and its output), so the router knows how many tokens the conversation's text so
far made, and how many bytes that text has: the conversation's own tokens per byte. The new text's bytes times that
ratio (with CALIBRATION_MARGIN to spare: the new text may tokenize denser), plus the template's markers, is the
estimate; it is never above the byte bound below, which is what a conversation without token ids gets. A wrong
estimate costs time, never correctness: the decode's own prefix cache computes exactly what matches, whichever way
the turn went.

The byte bound (the fallback):

Placement (local.py) runs a warm turn on the decode that holds its conversation when that decode lacks at most
`local_prefill_tokens` of the prompt. The router knows which tokens the decode holds (the handle's, and
what local turns computed since) but not, without a /tokenize, how the new prompt tokenizes. What it does know is
how the request relates to the last turn the decode ran: a handle records that turn's prompt and reply (`History`:
its messages, or its prompt text, hashed), and a request that repeats them unchanged and adds to them lacks, on
the decode, only what it adds. That is bounded from above without a tokenizer:
- a byte-level BPE token spans at least one byte of text, and pdctl's simulator's tokens are whitespace-separated
  words or specials, at least one character each: the UTF-8 bytes of the new text (a message's role, content,
  tool calls as JSON) bound its tokens;
- a chat template adds its markers around each message (ChatML: `<|im_start|>`, role, newlines, `<|im_end|>`)
  and the generation prompt: PER_MESSAGE_TOKENS each;
- the previous reply's last tokens (sampled, never fed back) and a merge across its end: TAIL_TOKENS.
A template that also re-renders earlier messages (one that drops earlier reasoning, a date line) makes the decode
compute more than the estimate: the answer is still right (the decode's own prefix cache reuses exactly what
matches), only the placement was optimistic. Any other request (history edited, fewer messages, images in what
is new, a conversation id whose messages differ) goes through the prefill, where the prefix is verified.
A token-id completion needs no estimate: its ids are compared with the decode's, exactly.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from pdctl.router import jsonx
from pdctl.router.kv.conversation import message_key, prompt_text
from pdctl.router.kv.handles import History
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import RequestContext
from pdctl.router.turn.verify import as_tokens

PER_MESSAGE_TOKENS = 16
TAIL_TOKENS = 16
# The learned tokens-per-byte ratio, times this: new text denser than the conversation so far (code in a chat,
# numbers in a tool result) still counts as at most its share.
CALIBRATION_MARGIN = 1.5
# Request fields that change how the whole history renders: a request differing in one extends nothing.
_RENDER = ("model", "tools", "chat_template", "chat_template_kwargs", "documents", "add_special_tokens")


def token_ids(ctx: RequestContext) -> array[int] | None:
    """A token-id completion's prompt (ids the router has without a tokenizer), else None."""
    prompt = ctx.body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    return as_tokens(prompt) if not ctx.chat and isinstance(prompt, list) else None


def _root(body: dict[str, Any]) -> int:
    return hash(("pdctl-history", jsonx.dumps({k: body[k] for k in _RENDER if k in body})))


def _chat_chain(body: dict[str, Any], extra: dict[str, Any] | None = None) -> list[int]:
    messages = [*body.get("messages", ()), *((extra,) if extra is not None else ())]
    chain = [_root(body)]
    for m in messages:
        chain.append(hash((chain[-1], message_key(m))))
    return chain


def history(ctx: RequestContext, capture: Capture) -> History | None:
    """This turn's prompt and the reply the client got, as the conversation's next request must repeat them."""
    body = ctx.body
    tokens = len(capture.prompt_ids) + len(capture.output_ids) if capture.prompt_ids and capture.ids_seen else 0
    if ctx.chat:
        reply = {"role": "assistant", **capture.reply()}
        chain = _chat_chain(body, reply)
        nbytes = sum(_message_bytes(m) for m in [*body.get("messages", ()), reply])
        return History(len(chain) - 1, chain[-1], tokens, nbytes)
    text = prompt_text(body.get("prompt"))
    if not isinstance(text, str):
        return None
    text += "".join(capture.text)
    return History(len(text), hash((_root(body), text)), tokens, _bytes(text))


def _estimate(h: History, new_bytes: int, markers: int) -> int:
    """The new text's tokens: its bytes bound them (byte-level BPE; the simulator's words), and, with the
    conversation's own tokens per byte known, its bytes at that ratio (with the margin) do, more tightly."""
    bound = new_bytes + markers
    if h.tokens <= 0 or h.nbytes <= 0:
        return bound
    return min(bound, math.ceil(new_bytes * h.tokens * CALIBRATION_MARGIN / h.nbytes) + markers)


def _bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _message_bytes(m: Any) -> int:
    """The bytes of a message's text as a template renders it: role, content, tool calls (name, arguments, a
    wrapper of PER_MESSAGE_TOKENS each) and the id they answer."""
    if not isinstance(m, dict):
        return len(jsonx.dumps(m))
    content = m.get("content")
    parts = content if isinstance(content, list) else [content]
    n = sum(_bytes(p) if isinstance(p, str) else _bytes(str(p.get("text", ""))) if isinstance(p, dict) else 0
            for p in parts)
    n += _bytes(str(m.get("role", ""))) + _bytes(str(m.get("tool_call_id") or "")) + _bytes(str(m.get("name") or ""))
    for call in m.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        n += PER_MESSAGE_TOKENS + (len(jsonx.dumps(fn)) if fn is not None else len(jsonx.dumps(call)))
    return n


def added_tokens(ctx: RequestContext, h: History | None) -> int | None:
    """At most how many tokens this request adds to `h` (module docstring); None when it does not extend it."""
    body = ctx.body
    if h is None or body.get("continue_final_message"):
        return None
    if ctx.chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or len(messages) <= h.size or _chat_chain(body)[h.size] != h.key:
            return None
        new = messages[h.size:]
        if any(isinstance(m, dict) and isinstance(m.get("content"), list)
               and any(not isinstance(c, dict) or c.get("type") != "text" for c in m["content"]) for m in new):
            return None  # an image's or audio's tokens are not bounded by its URL's bytes
        return _estimate(h, sum(_message_bytes(m) for m in new), TAIL_TOKENS + PER_MESSAGE_TOKENS * len(new))
    text = prompt_text(body.get("prompt"))
    if not isinstance(text, str) or len(text) <= h.size or hash((_root(body), text[:h.size])) != h.key:
        return None
    return _estimate(h, _bytes(text[h.size:]), TAIL_TOKENS)

