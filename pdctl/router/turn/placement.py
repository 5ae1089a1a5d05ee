"""Where a warm turn runs: on the decode that holds its KV (conditional disaggregation) or through a prefill.

A local turn skips the prefill hop and both transfers, but its new tokens are a prefill chunk in the decode's
batch: every stream on that decode waits for it. Through a prefill it queues behind whatever the prefill is
computing (other conversations' cold prefills), then pays the read back and the pull. Policies:

- `always`: the size rule alone.
- `load` (request counts): local while the decode has fewer than `busy_streams` requests in flight, and on a
  busy decode only when the prefill has at least as many in flight (no shorter a queue). A prefill with prefix
  caching (the default) computes a warm turn's new tokens in short steps beside other turns' task tokens, so
  through it a turn spares the busy decode's streams its chunk and usually waits less (sim run E).
- `work` (prompt tokens): both GPUs batch prefill chunks within one token budget, so a turn's first token waits
  about as long as the prompt tokens already in flight where it runs. Local while the decode's in-flight prefill
  tokens (other local turns not yet at their first token) are at most the prefill's plus `HOP_TOKENS`, the cost
  of the way through the prefill (read back, pull, a second hop) in tokens; else through the prefill. An idle
  decode always runs it; a decode already computing other turns' chunks hands it to a prefill with less queued,
  before the decode is saturated, and keeps it while the prefill is busy with cold prefills.
"""

from __future__ import annotations

from typing import Any

from pdctl.router.config import LocalPolicy
from pdctl.router.upstream.load import Load

# The way through a prefill costs a warm turn ~47-58 ms more than running it on its decode (CUDA graphs, block
# 256, 2k-24k: docs/results/h200x2-graphs-local), what a step spends on ~300-500 prompt tokens at that context.
HOP_TOKENS = 512
# Text prompts the router has not tokenized: about this many characters per token (an estimate, for load only).
CHARS_PER_TOKEN = 4


def run_locally(policy: LocalPolicy, missing: int, limit: int, decode: Load, prefill: Load | None,
                busy_streams: int) -> bool:
    """A warm turn lacking `missing` tokens on its decode: run it there? `limit` is local_prefill_tokens,
    `busy_streams` the decode load from which the `load` policy prefers an idle prefill."""
    if limit <= 0 or missing > limit:
        return False
    if policy == "always" or prefill is None:
        return True
    if policy == "work":
        return decode.tokens <= prefill.tokens + HOP_TOKENS
    if decode.requests < busy_streams:
        return True
    return prefill.requests >= decode.requests


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's size in tokens: exact for token ids, estimated from the characters of text and messages."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return _chars(prompt if prompt is not None else body.get("messages")) // CHARS_PER_TOKEN


def _chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_chars(v) for k, v in value.items() if k in ("content", "text", "arguments"))
    return 0
