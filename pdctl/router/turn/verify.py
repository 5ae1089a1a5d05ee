"""Prefix verification: reuse a decode's KV only where its tokens are exactly the new prompt's prefix.

vLLM checks nothing here (issue #43094): given a handle, the prefill reads `remote_num_tokens` tokens' worth of
the decode's blocks whatever the new prompt is. The router keeps the token ids each handle holds and compares:
    full match and a strictly longer prompt  -> hit, the handle as it is
    divergence after >= 1 whole block         -> partial: block ids and remote_num_tokens truncated together
    anything else                             -> miss (the prefill computes everything)

With `verify_at: prefill` the same rules run at the prefill (pdctl.prefix_check), which tokenizes the prompt
anyway: the router sends the handle with `remote_num_tokens` 0 and the digest chain of the held tokens, and the
verdict is what the prefill reports it verified (`at_prefill`, `settle`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdctl import prefix_check
from pdctl.router.wire import (
    PREFILL_CACHED,
    PREFIX_DIVERGED,
    PROMPT_NOT_LONGER,
    REASONS,
    TOKENS_UNKNOWN,
    VERIFIED,
    Outcome,
    Reuse,
)

MISS_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def miss_params() -> dict[str, Any]:
    return dict(MISS_PARAMS)


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str
    tokens: int
    params: dict[str, Any]
    # The prefill verifies: until its answer is read (`settle`), outcome and tokens are what a hit would be.
    pending: bool = False
    read: int | None = None  # tokens the prefill read from the decode, as it reported (settle)
    block: int | None = None  # prefix_diverged: the prompt's first block that differed from the held tokens

    @property
    def reuse(self) -> Reuse:
        """What the client is told (X-PD-KV-Reuse)."""
        return Reuse(self.outcome, self.tokens, self.reason, self.read, self.block)

    @property
    def header(self) -> str:
        return self.reuse.header


def miss(reason: str, block: int | None = None) -> Verdict:
    return Verdict("miss", reason, 0, miss_params(), block=block)


def hit_params(params: dict[str, Any]) -> dict[str, Any]:
    """The decode's params as the prefill must get them; unknown keys pass through untouched."""
    out = dict(params)
    out["do_remote_decode"] = True
    out["do_remote_prefill"] = False
    return out


def truncate(params: dict[str, Any], blocks: int, block_size: int) -> dict[str, Any]:
    """Keep only the first `blocks` blocks of every KV-cache group, and say so in remote_num_tokens."""
    out = hit_params(params)
    ids = params.get("remote_block_ids")
    if ids and isinstance(ids[0], list):
        out["remote_block_ids"] = [list(group[:blocks]) for group in ids]
    elif isinstance(ids, list):
        out["remote_block_ids"] = list(ids[:blocks])
    out["remote_num_tokens"] = blocks * block_size
    return out


def matching_blocks(held: Sequence[int], prompt: Sequence[int], block_size: int) -> int:
    """How many whole leading blocks of `held` equal the same positions of `prompt`."""
    limit = min(len(held), len(prompt)) // block_size
    lo, hi = 0, limit
    while lo < hi:  # the largest b with held[:b*bs] == prompt[:b*bs]; slices compare in C
        mid = (lo + hi + 1) // 2
        if held[: mid * block_size] == prompt[: mid * block_size]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def as_tokens(ids: Any) -> array[int] | None:
    """Token ids as a compact array, or None when they are not a list of token ids."""
    if not isinstance(ids, list):
        return None
    try:
        return array("i", ids)
    except (TypeError, OverflowError):
        return None


def verify(
    params: dict[str, Any],
    held: array[int] | None,
    prompt: array[int],
    block_size: int,
    partial_ok: bool = True,
) -> Verdict:
    n = params.get("remote_num_tokens")
    if not isinstance(n, int) or n <= 0 or held is None or len(held) < n:
        return miss(TOKENS_UNKNOWN)
    if len(prompt) <= n:
        return miss(PROMPT_NOT_LONGER)
    want = prompt[:n]
    if held[:n] == want:
        return Verdict("hit", VERIFIED, n, hit_params(params))
    blocks = matching_blocks(held[:n], want, block_size)  # block `blocks` is the first that differs
    if blocks == 0 or not partial_ok:
        return miss(PREFIX_DIVERGED, blocks)
    return Verdict("partial", PREFIX_DIVERGED, blocks * block_size, truncate(params, blocks, block_size),
                   block=blocks)


def at_prefill(params: dict[str, Any], spec: dict[str, Any] | None) -> Verdict:
    """The handle as a prefill that runs pdctl's prefix check gets it: nothing to read until it has verified."""
    n = params.get("remote_num_tokens")
    if spec is None or not isinstance(n, int) or n <= 0:
        return miss(TOKENS_UNKNOWN)
    out = hit_params(params)
    out["remote_num_tokens"] = 0
    out[prefix_check.FIELD] = spec
    return Verdict("hit", VERIFIED, n, out, pending=True)


_OUTCOMES: dict[object, Outcome] = {"hit": "hit", "partial": "partial", "miss": "miss"}


def settle(v: Verdict, answer: dict[str, Any] | None) -> Verdict | None:
    """The verdict once the prefill answered; the prefix fields are taken out of `answer` (never for the decode).

    None: `v` was pending and the answer has no readable report (the prefill does not run the check, so it read
    nothing: remote_num_tokens was 0)."""
    report = answer.pop(prefix_check.REPORT, None) if answer is not None else None
    if answer is not None:
        answer.pop(prefix_check.FIELD, None)
    if not v.pending:
        return v
    if not isinstance(report, dict):
        return None
    outcome, tokens, reason = _OUTCOMES.get(report.get("outcome")), report.get("tokens"), report.get("reason")
    if outcome is None or not isinstance(tokens, int) or isinstance(tokens, bool) or reason not in REASONS:
        return None
    if not 0 <= tokens <= v.tokens or (outcome == "miss") != (tokens == 0):
        return None
    if outcome == "hit" and tokens != v.tokens and reason != PREFILL_CACHED:
        return None
    read = report.get("read")
    read = read if isinstance(read, int) and not isinstance(read, bool) and 0 <= read <= tokens else None
    if reason == PREFILL_CACHED:
        read = 0
    assert isinstance(reason, str)
    block = _diverged_block(report, v.params) if reason == PREFIX_DIVERGED else None
    if outcome == "miss":
        return miss(reason, block)  # nothing read: no read= in the header
    return Verdict(outcome, reason, tokens, v.params, read=read, block=block)


def _diverged_block(report: dict[str, Any], params: dict[str, Any]) -> int | None:
    """The first block that differed, from the report's `diverged_at` (tokens; a prefill whose check predates it
    reports none) and the block size of the spec the router sent."""
    at, s = report.get(prefix_check.DIVERGED_AT), params.get(prefix_check.FIELD)
    size = s.get("block_size") if isinstance(s, dict) else None
    if not isinstance(at, int) or isinstance(at, bool) or at < 0 or not isinstance(size, int) or size <= 0:
        return None
    return at // size


def offered_tokens(params: dict[str, Any] | None, block_size: int) -> int | None:
    """The prompt tokens whose KV the prefill offers the decode (its answer's `remote_num_tokens`, else its block
    ids in whole blocks); None without an answer to read."""
    if params is None:
        return None
    n = params.get("remote_num_tokens")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    ids = params.get("remote_block_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids) * block_size if isinstance(ids, list) else None
