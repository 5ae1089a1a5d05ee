"""The prefix check a prefill runs before it reads a decode's KV: are the decode's tokens the new prompt's prefix?

vLLM trusts `remote_num_tokens` and the block ids it is given (issue #43094). The router knows which token ids a
decode's handle holds; the prefill is the one that tokenizes the new prompt anyway. So the router sends, with the
handle, a digest chain of the held tokens (`spec`) and `remote_num_tokens` 0, and the prefill, once it has the
prompt's ids and before its scheduler counts a single remote token, compares its own chain (`check`) and sets
`remote_num_tokens` to what it verified: all of it (hit), the leading whole blocks that match (partial), or 0
(miss: nothing is read, and the decode is told to free the blocks). A prefill without this check reads nothing
(remote_num_tokens is 0), so an engine that lacks it fails safe, as a miss.

The verdict's rules are the router's own (pdctl/router/verify.py): a hit needs a strictly longer prompt; a
partial keeps whole chunks of `chunk_tokens(block_size)` tokens (>= 256, a multiple of the block size).

The cheapest source of the verified tokens' KV (issue 29): the prefill's own prefix cache, then the decode's KV,
then recompute. The caller passes `cached`, the prompt tokens the prefill's prefix cache holds already (vLLM's
`num_computed_tokens`); only `verified - cached` would cross the link. When that is fewer than the spec's
`min_read` tokens (the router's estimate of a read's fixed cost: a handshake, the wait for the read's completion,
in tokens of compute), the prefill reads nothing: `remote_num_tokens` 0, which still tells the decode to free the
blocks. The report then says `prefill_cached` (the prefill's cache held all, or all but a few tokens it computes)
or, with nothing cached, `read_not_worth` (a miss: too few tokens to be worth a read). The report carries `cached`
and `read` (tokens the prefill reads from the decode) beside outcome, tokens and reason.

Standard library only, and nothing of pdctl: the same file runs in the router, in pdctl's simulator and, copied
verbatim by `pdctl.vllm_compat`, inside a vLLM prefill's scheduler.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Any

FIELD = "pdctl_prefix"  # in the params the router sends the prefill: the spec
REPORT = "pdctl_reuse"  # in the params the prefill answers with: what it verified
DIVERGED_AT = "diverged_at"  # in a prefix_diverged report: the first token of the first chunk that differed
VERSION = 1
DIGEST_BYTES = 12
MIN_CHUNK_TOKENS = 256

# The `reason` of a report; the same strings as pdctl.router.wire's reasons.
VERIFIED = "verified"
PREFIX_DIVERGED = "prefix_diverged"
PROMPT_NOT_LONGER = "prompt_not_longer"
SPEC_INVALID = "prefix_spec_invalid"
PREFILL_CACHED = "prefill_cached"
READ_NOT_WORTH = "read_not_worth"


def chunk_tokens(block_size: int) -> int:
    """The check's granularity: whole blocks, at least MIN_CHUNK_TOKENS tokens (fewer digests to send)."""
    return block_size * max(1, -(-MIN_CHUNK_TOKENS // block_size))


def _digest(prev: bytes, ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(prev + array("i", ids).tobytes(), digest_size=DIGEST_BYTES).digest()


def chain(ids: Sequence[int], step: int, limit: int) -> list[bytes]:
    """The running digest after each whole `step`-token chunk of `ids[:limit]`."""
    out: list[bytes] = []
    prev = b""
    for start in range(0, limit - limit % step, step):
        prev = _digest(prev, ids[start:start + step])
        out.append(prev)
    return out


def _full(links: list[bytes], ids: Sequence[int], step: int, n: int) -> bytes:
    """The digest of exactly `ids[:n]`: the chain's last link and the tokens after it."""
    return _digest(b"F" + (links[-1] if links else b""), ids[(n // step) * step:n])


def spec(held: Sequence[int], n: int, block_size: int, partial: bool = True, min_read: int = 0) -> dict[str, Any]:
    """What the router sends for a handle whose decode holds `held[:n]`; a read of fewer than `min_read` tokens
    beyond the prefill's own cache is not made (module docstring)."""
    step = chunk_tokens(block_size)
    links = chain(held, step, n)
    return {"v": VERSION, "n": n, "block_size": block_size, "step": step, "partial": partial,
            "chain": [d.hex() for d in links], "full": _full(links, held, step, n).hex(), "min_read": min_read}


def _valid(s: Any) -> bool:
    if not isinstance(s, dict) or s.get("v") != VERSION:
        return False
    n, bs, step, links = s.get("n"), s.get("block_size"), s.get("step"), s.get("chain")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (n, bs, step)):
        return False
    assert isinstance(n, int) and isinstance(bs, int)
    return (n > 0 and bs > 0 and step == chunk_tokens(bs) and isinstance(links, list)
            and len(links) == n // step and all(isinstance(d, str) for d in links)
            and isinstance(s.get("full"), str))


def _truncate(params: dict[str, Any], blocks: int) -> None:
    ids = params.get("remote_block_ids")
    if ids and isinstance(ids[0], list):
        params["remote_block_ids"] = [list(group[:blocks]) for group in ids]
    elif isinstance(ids, list):
        params["remote_block_ids"] = list(ids[:blocks])


def _min_read(s: dict[str, Any]) -> int:
    m = s.get("min_read", 0)
    return m if isinstance(m, int) and not isinstance(m, bool) and m > 0 else 0


def check(params: dict[str, Any], prompt: Sequence[int], cached: int = 0) -> dict[str, Any] | None:
    """Verify the spec in `params` (taken out of it) against the prompt's ids, in place; `cached`: the prompt
    tokens the prefill's own prefix cache holds.

    Sets `remote_num_tokens` (and, for a partial, truncates `remote_block_ids` to the verified blocks) and puts the
    report under REPORT; returns the report, or None when `params` carries no spec. A prefix_diverged report says
    where (DIVERGED_AT): the first token of the first chunk that differed, every chunk before it matched.
    """
    s = params.pop(FIELD, None)
    if s is None:
        return None
    outcome, tokens, reason = "miss", 0, SPEC_INVALID
    diverged: int | None = None
    if _valid(s):
        n, bs, step = s["n"], s["block_size"], s["step"]
        if len(prompt) <= n:
            reason = PROMPT_NOT_LONGER
        else:
            mine = chain(prompt, step, n)
            theirs = s["chain"]
            if [d.hex() for d in mine] == theirs and _full(mine, prompt, step, n).hex() == s["full"]:
                outcome, tokens, reason = "hit", n, VERIFIED
            else:
                reason = PREFIX_DIVERGED
                same = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a.hex() != b),
                            len(mine))
                diverged = same * step
                if same > 0 and s["partial"]:
                    outcome, tokens = "partial", same * step
                    _truncate(params, tokens // bs)
    cached = max(0, min(cached, len(prompt)))
    read = max(0, tokens - cached)
    if tokens > 0 and (read == 0 or read < _min_read(s)):
        # The prefill's own cache (or a short recompute) is the cheaper source: read nothing.
        if cached > 0:
            tokens, reason = min(cached, tokens), PREFILL_CACHED
        else:
            outcome, tokens, reason = "miss", 0, READ_NOT_WORTH
        read = 0
        params["remote_num_tokens"] = 0
    else:
        params["remote_num_tokens"] = tokens
    report: dict[str, Any] = {"outcome": outcome, "tokens": tokens, "reason": reason, "cached": cached,
                              "read": read}
    if diverged is not None:
        report[DIVERGED_AT] = diverged
    params[REPORT] = report
    return report
