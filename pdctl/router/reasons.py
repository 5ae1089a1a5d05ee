"""Why the router did what it did with a turn's KV, and where that KV came from: the `reason=` of X-PD-KV-Reuse
(the keys of /stats `reuse_reasons`), each reason in words, and the one account of a turn's KV source. Part of the
router's public signals: `pdctl.router.wire` re-exports every name. Imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

# Reasons (the `reason=` of X-PD-KV-Reuse, the keys of /stats `reuse_reasons`).
VERIFIED = "verified"  # hit: the decode's tokens are exactly the new prompt's prefix
UNVERIFIED = "unverified"  # hit taken on trust (--no-verify-prefix)
DECODE_LOCAL = "decode_local"  # hit: the decode served the turn alone from its own prefix cache
PREFIX_DIVERGED = "prefix_diverged"  # partial (whole blocks kept) or miss: the prompt does not extend the tokens
TOKENS_UNKNOWN = "tokens_unknown"  # the router does not know which tokens the handle holds
PROMPT_NOT_LONGER = "prompt_not_longer"  # the prompt adds nothing to what the decode holds
NEW_CONVERSATION = "new_conversation"  # no earlier turn of this conversation
NOT_ELIGIBLE = "not_eligible"  # the request cannot take part in reuse (no conversation)
HANDLE_IN_USE = "handle_in_use"  # another turn of the conversation holds the handle right now
DECODE_RESTARTED = "decode_restarted"  # the decode that holds the blocks may have died since
EXPIRED = "expired"  # the handle outlived the router's trust in it
EVICTED = "evicted"  # the handle table was full
RELEASED = "released"  # the router freed the handle's blocks: its decode was over router.pin_budget_tokens or left
PREVIOUS_TURN_FAILED = "previous_turn_failed"  # the turn that took the handle did not leave a new one
NO_HANDLE_RETURNED = "no_handle_returned"  # the decode's answer carried no kv_transfer_params
TOKENIZE_FAILED = "tokenize_failed"  # the router could not tokenize the prompt to verify it
PREFILL_UNCHECKED = "prefill_unchecked"  # miss: the prefill does not run pdctl's prefix check, so it read nothing
PREFIX_SPEC_INVALID = "prefix_spec_invalid"  # miss: the prefill could not read the router's digests of the handle
PREFILL_FAILED = "prefill_failed"  # the prefill failed reading the handle; it was retried as a miss
PREFILL_REDONE = "prefill_redone"  # the decode could not use the prefill's KV; the prefill ran again
PREFILL_CACHED = "prefill_cached"  # hit: the prefill's own prefix cache held the history (all, or all but fewer
# than router.min_read_tokens, which it computed): nothing was read from the decode, whose blocks are freed
READ_NOT_WORTH = "read_not_worth"  # miss: fewer than router.min_read_tokens to read and none cached: recomputed
N_GT_1 = "n_gt_1"  # n > 1 samples: served by a decode alone
# Served whole on a prefill (router.overflow_kv: the decode was short of KV): hit when the conversation's last turn
# ran there too (its prefix cache holds it), miss when it moved there; tokens 0 (the router does not know what the
# prefill's prefix cache reuses). Also the miss reason of a conversation's next turn through a decode.
WHOLE_PREFILL = "whole_prefill"
# Where a turn's history KV came from, cheapest first (`kv_source`; the `source` label of
# pdctl_router_turn_kv_source_total, the bench's paths).
DECODE_READ = "decode_read"  # read back from the decode that holds the conversation (D->P), hit or partial
DECODE_CACHE = "decode_cache"  # the decode's own prefix cache: a local turn, no transfer
PREFILL_WHOLE = "prefill_whole"  # served whole on a prefill (overflow_kv), from its own prefix cache if anything
RECOMPUTED = "recomputed"  # a miss: the prefill computed the prompt (its prefix cache may still have helped)
PREFILL_CACHE = "prefill_cache"  # the prefill's own prefix cache held it (prefill_cached, or a warm turn's miss
# whose prefill reported cached tokens): nothing read, the rest computed
KV_SOURCES = (DECODE_READ, DECODE_CACHE, PREFILL_CACHE, PREFILL_WHOLE, RECOMPUTED)
# The `direction` label of pdctl_router_kv_moved_tokens: what crossed between engines for one turn.
D_TO_P = "d_to_p"  # the prefill read the decode's verified tokens (X-PD-KV-Reuse tokens)
P_TO_D = "p_to_d"  # the decode was offered the prefill's prompt KV (its own prefix cache may cover part)


def kv_source(outcome: str, reason: str, read: int | None = None, cached: int | None = None) -> str:
    """Where a turn's history KV came from, given its X-PD-KV-Reuse outcome, reason and, where the prefill
    reported them, what it read from the decode and what its own prefix cache held. The one account: the router's
    metric and traces, the bench's path labels (pdctl.bench.results.paths). A warm turn's miss (bidirectional off, a
    released handle, ...) whose prefill found part of the prompt in its own cache is `prefill_cache`: nothing was
    read and not all was recomputed; a conversation's first turn is `recomputed` whatever the cache shared."""
    if reason == DECODE_LOCAL:
        return DECODE_CACHE
    if reason == WHOLE_PREFILL:
        return PREFILL_WHOLE
    if outcome not in ("hit", "partial"):
        warm = reason not in (NEW_CONVERSATION, NOT_ELIGIBLE)
        return PREFILL_CACHE if warm and cached else RECOMPUTED
    if reason == PREFILL_CACHED or read == 0:
        return PREFILL_CACHE
    return DECODE_READ


# Each reason in a few words: what an operator reads next to a miss.
REASON_TEXT: Mapping[str, str] = {
    VERIFIED: "the decode's tokens are the prompt's prefix",
    UNVERIFIED: "reused without verification (verify_prefix off)",
    DECODE_LOCAL: "served by the decode alone from its prefix cache",
    PREFIX_DIVERGED: "the prompt differs from what the decode holds",
    TOKENS_UNKNOWN: "the router does not know the tokens the handle holds",
    PROMPT_NOT_LONGER: "the prompt adds nothing to what the decode holds",
    NEW_CONVERSATION: "first turn of its conversation",
    NOT_ELIGIBLE: "the request has no conversation (n > 1, or no id and nothing to derive one from)",
    HANDLE_IN_USE: "another turn of the conversation holds its handle",
    DECODE_RESTARTED: "the decode that held the KV was ejected or restarted",
    EXPIRED: "the handle outlived the router's trust (handle_ttl or decoder_kv_blocks_ttl)",
    EVICTED: "the handle table was full (max_handles)",
    RELEASED: "released under pin pressure (pin_budget_tokens / pin_budget_fraction)",
    PREVIOUS_TURN_FAILED: "the previous turn took the handle and left none",
    NO_HANDLE_RETURNED: "the decode's answer carried no kv_transfer_params",
    TOKENIZE_FAILED: "the router could not tokenize the prompt to verify it",
    PREFILL_UNCHECKED: "the prefill does not run pdctl's prefix check (re-provision, or verify_at: router)",
    PREFIX_SPEC_INVALID: "the prefill could not read the router's digests",
    PREFILL_FAILED: "the prefill failed reading the decode's KV; retried as a recompute",
    PREFILL_REDONE: "the decode could not use the prefill's KV; the prefill ran again",
    N_GT_1: "n > 1 samples, served by a decode alone",
    WHOLE_PREFILL: "served whole on a prefill (overflow_kv)",
    PREFILL_CACHED: "the prefill's own prefix cache held the history: nothing read from the decode",
    READ_NOT_WORTH: "too little to read from the decode (router.min_read_tokens) and nothing cached: recomputed",
}
REASONS = frozenset({
    VERIFIED, UNVERIFIED, DECODE_LOCAL, PREFIX_DIVERGED, TOKENS_UNKNOWN, PROMPT_NOT_LONGER, NEW_CONVERSATION,
    NOT_ELIGIBLE, HANDLE_IN_USE, DECODE_RESTARTED, EXPIRED, EVICTED, RELEASED, PREVIOUS_TURN_FAILED, NO_HANDLE_RETURNED,
    TOKENIZE_FAILED, PREFILL_UNCHECKED, PREFIX_SPEC_INVALID, PREFILL_FAILED, PREFILL_REDONE, N_GT_1, WHOLE_PREFILL,
    PREFILL_CACHED, READ_NOT_WORTH,
})
# The (outcome, reason) pairs a turn can be counted under (pdctl_router_kv_reuse_total): all of them are exported
# at 0 from the router's start, so a dashboard's hit rate has its series before the first hit, and after a restart.
_HIT_ONLY = frozenset({VERIFIED, UNVERIFIED, DECODE_LOCAL})
REUSE_PAIRS: tuple[tuple[str, str], ...] = (
    *(("hit", r) for r in (VERIFIED, UNVERIFIED, DECODE_LOCAL, PREFILL_CACHED, WHOLE_PREFILL)),
    *(("partial", r) for r in (PREFIX_DIVERGED, PREFILL_CACHED)),
    *(("miss", r) for r in sorted(REASONS - _HIT_ONLY - {PREFILL_CACHED})),
)
