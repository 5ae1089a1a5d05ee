"""The router's public signals, written and read here only: the `X-PD-*` headers and the `/stats` document.

    X-PD-KV-Reuse: <outcome>;tokens=<N>[;read=<R>][;block=<B>];reason=<reason>
        what the router did with the decode's KV:
        outcome  hit | partial | miss
        tokens   prompt tokens not recomputed: read from a decode or held by the prefill's own prefix cache (a hit
                 or partial through the prefill, as the prefill verified them; reason prefill_cached: the prefill's
                 cache alone), or, on a local turn (reason decode_local), the conversation's tokens the decode's
                 prefix cache holds, whole blocks: what it reuses of them is its own match, never more
        reason   one of REASONS (why a hit, why a miss); with SOURCE_OF a turn's source of its history's KV
        read     tokens the prefill read from the decode (D->P), where the prefill reported it (verify_at prefill)
        block    prefix_diverged only: the first KV block (0-based, block_size tokens) of the prompt that differed
                 from what the decode holds; every block before it matched. Verified at the prefill, whose check
                 compares chunks of >= 256 tokens, it is the first block of the first chunk that differed.
    A list of prompts (/v1/completions) answers one value per prompt, joined by ", " (`Reuse.parse_list`).
    X-PD-Prefill-Ms, X-PD-Router-In-Ms, X-PD-Decode-Ms: milliseconds, one decimal (`raw_ms`, `parse_ms`).

Everything outside pdctl/router/ (status, the smoke test, the bench) reads the router through this module and
`pdctl.router.config`; it imports nothing of pdctl, so the bench's client can carry it anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

REUSE_HEADER = "x-pd-kv-reuse"
PREFILL_MS_HEADER = "x-pd-prefill-ms"
ROUTER_IN_MS_HEADER = "x-pd-router-in-ms"
DECODE_MS_HEADER = "x-pd-decode-ms"

Outcome = Literal["hit", "partial", "miss"]
# What a reader may find instead of a router's outcome: no header, or one it cannot read.
ReadOutcome = Literal["hit", "partial", "miss", "absent", "malformed"]
_OUTCOMES: dict[str, Outcome] = {"hit": "hit", "partial": "partial", "miss": "miss"}

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
# Where a turn's prompt KV came from (the `source` label of pdctl_router_turn_kv_source_total; `kv_source`).
DECODE_READ = "decode_read"  # read back from the decode that holds the conversation (D->P), hit or partial
DECODE_CACHE = "decode_cache"  # the decode's own prefix cache: a local turn, no transfer
PREFILL_WHOLE = "prefill_whole"  # served whole on a prefill (overflow_kv), from its own prefix cache if anything
RECOMPUTED = "recomputed"  # a miss: the prefill computed the prompt (its prefix cache may still have helped)
PREFILL_CACHE = "prefill_cache"  # the prefill's own prefix cache held it (prefill_cached): nothing read or recomputed
KV_SOURCES = (DECODE_READ, DECODE_CACHE, PREFILL_CACHE, PREFILL_WHOLE, RECOMPUTED)
# The `direction` label of pdctl_router_kv_moved_tokens: what crossed between engines for one turn.
D_TO_P = "d_to_p"  # the prefill read the decode's verified tokens (X-PD-KV-Reuse tokens)
P_TO_D = "p_to_d"  # the decode was offered the prefill's prompt KV (its own prefix cache may cover part)


def kv_source(outcome: str, reason: str) -> str:
    """Where a turn's KV came from, given its X-PD-KV-Reuse outcome and reason."""
    if reason == DECODE_LOCAL:
        return DECODE_CACHE
    if reason == WHOLE_PREFILL:
        return PREFILL_WHOLE
    if reason == PREFILL_CACHED:
        return PREFILL_CACHE
    return DECODE_READ if outcome in ("hit", "partial") else RECOMPUTED


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

# Where a warm turn's history KV came from (issue 29): the cheapest source, in this order.
SOURCE_PREFILL_CACHE = "prefill_cache"  # the prefill's own prefix cache (nothing moved from the decode)
SOURCE_DECODE_READ = "decode_read"  # a D->P read of what the prefill lacked
SOURCE_DECODE_LOCAL = "decode_local"  # the turn ran on its decode alone (its prefix cache; nothing moved)
SOURCE_RECOMPUTE = "recompute"  # a miss: the prefill computed what its own cache lacked


def source_of(outcome: str, reason: str, read: int | None = None) -> str:
    """The source of a turn's history KV, from its X-PD-KV-Reuse outcome, reason and read."""
    if reason == DECODE_LOCAL:
        return SOURCE_DECODE_LOCAL
    if reason == PREFILL_CACHED or (outcome in ("hit", "partial") and read == 0):
        return SOURCE_PREFILL_CACHE
    if outcome in ("hit", "partial"):
        return SOURCE_DECODE_READ
    return SOURCE_RECOMPUTE


@dataclass(frozen=True)
class Reuse:
    """One X-PD-KV-Reuse value. Read from a response, `outcome` may also be "absent" or "malformed"."""

    outcome: ReadOutcome
    tokens: int = 0
    reason: str = ""
    read: int | None = None  # tokens the prefill read from the decode, where it said (None: not reported)
    block: int | None = None  # prefix_diverged: the first block that differed

    @property
    def header(self) -> str:
        # read and block before the reason: a reader that takes whatever follows `reason=` still reads the reason.
        read = f";read={self.read}" if self.read is not None else ""
        block = f";block={self.block}" if self.block is not None else ""
        return f"{self.outcome};tokens={self.tokens}{read}{block};reason={self.reason}"

    @property
    def source(self) -> str:
        """Where the turn's history KV came from (`source_of`)."""
        return source_of(self.outcome, self.reason, self.read)

    @property
    def explanation(self) -> str:
        """The reason in words, with where a diverged prefix differed (`pdctl top`, logs, traces)."""
        words = REASON_TEXT.get(self.reason, self.reason)
        if self.block is not None:
            words += f", first differing block {self.block}"
        return words

    def raw(self) -> tuple[bytes, bytes]:
        """The header as an ASGI (name, value) pair."""
        return REUSE_HEADER.encode(), self.header.encode()

    @property
    def reused(self) -> bool:
        return self.outcome in ("hit", "partial")

    @classmethod
    def parse(cls, value: str | None) -> Reuse:
        """Never raises: no header reads as "absent", one that is not `outcome;tokens=N;reason=R` as
        "malformed" with the value in its reason. Keys it does not know are skipped."""
        if value is None or not value.strip():
            return cls("absent", 0, "no X-PD-KV-Reuse header")
        if "," in value:
            return _malformed(value, "a list of values (read it with Reuse.parse_list)")
        word, *params = (p.strip() for p in value.split(";"))
        outcome = _OUTCOMES.get(word.lower())
        if outcome is None:
            return _malformed(value, f"outcome {word!r} is none of hit, partial, miss")
        fields = dict(p.partition("=")[::2] for p in params if "=" in p)
        tokens = fields.get("tokens", "0")
        if not tokens.isdigit():
            return _malformed(value, f"tokens={tokens!r} is not a count")
        read = fields.get("read")
        block = fields.get("block")
        if block is not None and not block.isdigit():
            return _malformed(value, f"block={block!r} is not a block index")
        return cls(outcome, int(tokens), fields.get("reason", ""), int(read) if read and read.isdigit() else None,
                   int(block) if block is not None else None)

    @classmethod
    def parse_list(cls, value: str | None) -> list[Reuse]:
        """A list of prompts' values; one value reads as a list of one."""
        if value is None or not value.strip():
            return [cls.parse(value)]
        return [cls.parse(part) for part in value.split(",")]


def _malformed(value: str, why: str) -> Reuse:
    return Reuse("malformed", 0, f"unreadable X-PD-KV-Reuse header {value.strip()!r}: {why}")


def raw_ms(name: str, ms: float) -> tuple[bytes, bytes]:
    """An X-PD-*-Ms header as the router writes it (one decimal), as the (name, value) pair ASGI sends."""
    return name.encode(), f"{ms:.1f}".encode()


def parse_ms(value: str | None) -> float | None:
    """An X-PD-*-Ms header; None when absent or not a number."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class UpstreamStats:
    """One prefill or decode instance as the router sees it."""

    url: str
    healthy: bool
    outstanding: int
    failures: int
    generation: int
    work: int = 0  # prompt tokens of its in-flight requests not yet computed (router.placement's estimate)
    draining: bool = False  # leaving: no new turns (the router's members file, pdctl.router.upstream.members)
    held: int = 0  # decodes: live handles on it plus releases to it still in flight (a drain waits for 0)


@dataclass(frozen=True)
class RouterStats:
    """The router's `GET /stats` document. `from_json(x.to_json()) == x`."""

    requests_total: int
    reuse: Mapping[str, int]  # outcome -> turns (hit, partial, miss)
    reuse_reasons: Mapping[str, int] = field(default_factory=dict)
    reused_tokens_total: int = 0
    local_turns: int = 0
    whole_prefill_turns: int = 0  # turns served whole on a prefill (router.overflow_kv)
    hit_rate: float = 0.0  # (hit + partial) / eligible_turns, 4 decimals
    eligible_turns: int = 0
    live_handles: int = 0
    pinned_tokens: Mapping[str, int] = field(default_factory=dict)  # decode URL -> tokens its live handles pin
    pin_budget_tokens: Mapping[str, int] = field(default_factory=dict)  # decode URL -> its budget (none: absent)
    releases: Mapping[str, int] = field(default_factory=dict)  # why -> releases sent (pdctl.router.kv.release)
    releases_failed: int = 0  # releases that did not reach a prefill or that it refused
    kv_use: Mapping[str, float] = field(default_factory=dict)  # engine URL -> its KV in use as the router sees it
    prefill: tuple[UpstreamStats, ...] = ()
    decode: tuple[UpstreamStats, ...] = ()
    uptime_s: float = 0.0
    version: str = ""

    @property
    def hit(self) -> int:
        return self.reuse.get("hit", 0)

    @property
    def partial(self) -> int:
        return self.reuse.get("partial", 0)

    @property
    def miss(self) -> int:
        return self.reuse.get("miss", 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "reuse": dict(self.reuse),
            "reuse_reasons": dict(self.reuse_reasons),
            "reused_tokens_total": self.reused_tokens_total,
            "local_turns": self.local_turns,
            "whole_prefill_turns": self.whole_prefill_turns,
            "hit_rate": self.hit_rate,
            "eligible_turns": self.eligible_turns,
            "live_handles": self.live_handles,
            "pinned_tokens": dict(self.pinned_tokens),
            "pin_budget_tokens": dict(self.pin_budget_tokens),
            "releases": dict(self.releases),
            "releases_failed": self.releases_failed,
            "kv_use": dict(self.kv_use),
            "prefill": [_upstream_json(u) for u in self.prefill],
            "decode": [_upstream_json(u) for u in self.decode],
            "uptime_s": self.uptime_s,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, doc: object) -> RouterStats:
        """Raises ValueError naming the first field that is missing or of the wrong type. `requests_total` and
        `reuse` are required; the rest default, so a router one release older still reads."""
        d = _object(doc, "the document")
        return cls(
            requests_total=_int(d, "requests_total", required=True),
            reuse=_counts(d, "reuse", required=True),
            reuse_reasons=_counts(d, "reuse_reasons"),
            reused_tokens_total=_int(d, "reused_tokens_total"),
            local_turns=_int(d, "local_turns"),
            whole_prefill_turns=_int(d, "whole_prefill_turns"),
            hit_rate=_float(d, "hit_rate"),
            eligible_turns=_int(d, "eligible_turns"),
            live_handles=_int(d, "live_handles"),
            pinned_tokens=_counts(d, "pinned_tokens"),
            pin_budget_tokens=_counts(d, "pin_budget_tokens"),
            releases=_counts(d, "releases"),
            releases_failed=_int(d, "releases_failed"),
            kv_use=_fractions(d, "kv_use"),
            prefill=_upstreams(d, "prefill"),
            decode=_upstreams(d, "decode"),
            uptime_s=_float(d, "uptime_s"),
            version=_str(d, "version"),
        )


def _upstream_json(u: UpstreamStats) -> dict[str, object]:
    return {"url": u.url, "healthy": u.healthy, "outstanding": u.outstanding, "work": u.work,
            "failures": u.failures, "generation": u.generation, "draining": u.draining, "held": u.held}


def _bad(what: str, want: str, got: object) -> ValueError:
    return ValueError(f"router /stats: {what} is not {want}: {got!r:.80}")


def _object(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise _bad(what, "a JSON object", value)
    return value


def _get(d: Mapping[str, object], key: str, required: bool) -> object:
    if key not in d and required:
        raise ValueError(f"router /stats: `{key}` is missing (is this a pdctl router?)")
    return d.get(key)


def _int(d: Mapping[str, object], key: str, required: bool = False) -> int:
    v = _get(d, key, required)
    if v is None and not required:
        return 0
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(f"`{key}`", "an integer", v)
    return v


def _float(d: Mapping[str, object], key: str) -> float:
    v = d.get(key)
    if v is None:
        return 0.0
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise _bad(f"`{key}`", "a number", v)
    return float(v)


def _str(d: Mapping[str, object], key: str) -> str:
    v = d.get(key, "")
    if not isinstance(v, str):
        raise _bad(f"`{key}`", "a string", v)
    return v


def _counts(d: Mapping[str, object], key: str, required: bool = False) -> dict[str, int]:
    v = _get(d, key, required)
    if v is None and not required:
        return {}
    out: dict[str, int] = {}
    for k, n in _object(v, f"`{key}`").items():
        if not isinstance(n, int) or isinstance(n, bool):
            raise _bad(f"`{key}.{k}`", "an integer", n)
        out[k] = n
    return out


def _fractions(d: Mapping[str, object], key: str) -> dict[str, float]:
    v = d.get(key)
    if v is None:
        return {}
    out: dict[str, float] = {}
    for k, n in _object(v, f"`{key}`").items():
        if not isinstance(n, int | float) or isinstance(n, bool):
            raise _bad(f"`{key}.{k}`", "a number", n)
        out[k] = float(n)
    return out


def _upstreams(d: Mapping[str, object], key: str) -> tuple[UpstreamStats, ...]:
    v = d.get(key, [])
    if not isinstance(v, list):
        raise _bad(f"`{key}`", "a list", v)
    out: list[UpstreamStats] = []
    for i, item in enumerate(v):
        u = _object(item, f"`{key}[{i}]`")
        url, healthy = u.get("url"), u.get("healthy")
        if not isinstance(url, str):
            raise _bad(f"`{key}[{i}].url`", "a string", url)
        if not isinstance(healthy, bool):
            raise _bad(f"`{key}[{i}].healthy`", "true or false", healthy)
        draining = u.get("draining", False)
        if not isinstance(draining, bool):
            raise _bad(f"`{key}[{i}].draining`", "true or false", draining)
        out.append(UpstreamStats(url, healthy, _int(u, "outstanding"), _int(u, "failures"), _int(u, "generation"),
                                 _int(u, "work"), draining, _int(u, "held")))
    return tuple(out)


@dataclass(frozen=True)
class Members:
    """The router's members file (`--members-file`, re-read on SIGHUP; pdctl.router.server.membership):

        {"prefill": [URL...], "decode": [URL...], "draining": [URL...]}

    `draining` members serve what they already have and take no new turn; members left out are removed once idle.
    """

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    draining: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, list[str]]:
        return {"prefill": list(self.prefill), "decode": list(self.decode), "draining": sorted(self.draining)}

    @classmethod
    def from_json(cls, doc: object) -> Members:
        """Raises ValueError naming the part that is wrong."""
        d = _object(doc, "the members file")
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("prefill", "decode", "draining"):
            v = d.get(key, [])
            if not isinstance(v, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                  for u in v):
                raise ValueError(f"`{key}` must be a list of http(s) URLs, got {v!r:.80}")
            lists[key] = tuple(u.rstrip("/") for u in v)
        return cls(lists["prefill"], lists["decode"], frozenset(lists["draining"]))
