"""The router's public signals, written and read here only: the `X-PD-*` headers and the `/stats` document.

    X-PD-KV-Reuse: <outcome>;tokens=<N>[;read=<R>][;block=<B>];reason=<reason>
        what the router did with the decode's KV:
        outcome  hit | partial | miss
        tokens   prompt tokens not recomputed: read from a decode or held by the prefill's own prefix cache (a hit
                 or partial through the prefill, as the prefill verified them; reason prefill_cached: the prefill's
                 cache alone), or, on a local turn (reason decode_local), the conversation's tokens the decode's
                 prefix cache holds, whole blocks: what it reuses of them is its own match, never more
        reason   one of REASONS (why a hit, why a miss; pdctl.router.reasons), which with the outcome and read
                 tells where the turn's history KV came from (`kv_source`)
        read     tokens the prefill read from the decode (D->P), where the prefill reported it (verify_at prefill)
        cached   prompt tokens the prefill did not compute (its prefix-cache hit plus its read), as it reported them
                 in usage.prompt_tokens_details (vLLM's --enable-prompt-tokens-details); absent where it did not.
                 On a warm turn's miss (nothing read), > 0: its own cache served part of the history (kv source
                 prefill_cache, not recomputed)
        block    prefix_diverged only: the first KV block (0-based, block_size tokens) of the prompt that differed
                 from what the decode holds; every block before it matched. Verified at the prefill, whose check
                 compares chunks of >= 256 tokens, it is the first block of the first chunk that differed.
    A list of prompts (/v1/completions) answers one value per prompt, joined by ", " (`Reuse.parse_list`).
    X-PD-Prefill-Ms, X-PD-Router-In-Ms, X-PD-Decode-Ms: milliseconds, one decimal (`raw_ms`, `parse_ms`).
    X-PD-KV-Choice: <source>;basis=<model|default|probe>[;predicted_ms=<ms>][;refused=<why>]
        a warm turn's KV source as the router's cost model chose it (`KvChoice`; pdctl.router.turn.cost):
        source        decode_cache (the decode alone), decode_read (the prefill reads the history from the decode),
                      recomputed (the prefill computes it); the prefill may still find its own cache cheaper
                      (X-PD-KV-Reuse says what happened)
        basis         model, or default: its rates were not yet measured and the rule before it chose, or probe: a
                      local turn that measures the decode's costs (router.local_stall_ratio 0)
        predicted_ms  the model's predicted time to first token (basis model)
        refused       why the decode alone was not chosen: itl (its step would break router.itl_slo_ms),
                      stall (it would lengthen the other streams' step past router.local_stall_ratio x
                      it), slower (a prefill was cheaper), cap (over router.local_prefill_tokens),
                      unmeasured (the decode's costs not yet measured, other streams on it)

Everything outside pdctl/router/ (status, the smoke test, the bench) reads the router through this module and
`pdctl.router.config`. It re-exports the reasons and KV sources (pdctl.router.reasons) and the /stats and members
documents (pdctl.router.documents); it and they import nothing else of pdctl, so the bench's client can carry them
anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pdctl.router.documents import (
    DecodeRetention,
    KvChoiceStats,
    Members,
    RetentionStats,
    RouterStats,
    UpstreamStats,
)
from pdctl.router.reasons import (
    D_TO_P,
    DECODE_CACHE,
    DECODE_LOCAL,
    DECODE_READ,
    DECODE_RESTARTED,
    EVICTED,
    EXPIRED,
    HANDLE_IN_USE,
    KV_SOURCES,
    N_GT_1,
    NEW_CONVERSATION,
    NO_HANDLE_RETURNED,
    NOT_ELIGIBLE,
    P_TO_D,
    PREFILL_CACHE,
    PREFILL_CACHED,
    PREFILL_FAILED,
    PREFILL_REDONE,
    PREFILL_UNCHECKED,
    PREFILL_WHOLE,
    PREFIX_DIVERGED,
    PREFIX_SPEC_INVALID,
    PREVIOUS_TURN_FAILED,
    PROMPT_NOT_LONGER,
    READ_NOT_WORTH,
    REASON_TEXT,
    REASONS,
    RECOMPUTED,
    RELEASED,
    REUSE_PAIRS,
    TOKENIZE_FAILED,
    TOKENS_UNKNOWN,
    UNVERIFIED,
    VERIFIED,
    WHOLE_PREFILL,
    kv_source,
)

REUSE_HEADER = "x-pd-kv-reuse"
PREFILL_MS_HEADER = "x-pd-prefill-ms"
ROUTER_IN_MS_HEADER = "x-pd-router-in-ms"
DECODE_MS_HEADER = "x-pd-decode-ms"
KV_CHOICE_HEADER = "x-pd-kv-choice"

Outcome = Literal["hit", "partial", "miss"]
# What a reader may find instead of a router's outcome: no header, or one it cannot read.
ReadOutcome = Literal["hit", "partial", "miss", "absent", "malformed"]
_OUTCOMES: dict[str, Outcome] = {"hit": "hit", "partial": "partial", "miss": "miss"}

@dataclass(frozen=True)
class Reuse:
    """One X-PD-KV-Reuse value. Read from a response, `outcome` may also be "absent" or "malformed"."""

    outcome: ReadOutcome
    tokens: int = 0
    reason: str = ""
    read: int | None = None  # tokens the prefill read from the decode, where it said (None: not reported)
    block: int | None = None  # prefix_diverged: the first block that differed
    cached: int | None = None  # prompt tokens the prefill did not compute (cache hit + read), where it reported


    @property
    def header(self) -> str:
        # read and block before the reason: a reader that takes whatever follows `reason=` still reads the reason.
        read = f";read={self.read}" if self.read is not None else ""
        block = f";block={self.block}" if self.block is not None else ""
        cached = f";cached={self.cached}" if self.cached is not None else ""
        return f"{self.outcome};tokens={self.tokens}{read}{block}{cached};reason={self.reason}"

    @property
    def source(self) -> str:
        """Where the turn's history KV came from (`kv_source`)."""
        return kv_source(self.outcome, self.reason, self.read, self.cached)

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
        cached = fields.get("cached")
        return cls(outcome, int(tokens), fields.get("reason", ""), int(read) if read and read.isdigit() else None,
                   int(block) if block is not None else None, int(cached) if cached and cached.isdigit() else None)

    @classmethod
    def parse_list(cls, value: str | None) -> list[Reuse]:
        """A list of prompts' values; one value reads as a list of one."""
        if value is None or not value.strip():
            return [cls.parse(value)]
        return [cls.parse(part) for part in value.split(",")]


def _malformed(value: str, why: str) -> Reuse:
    return Reuse("malformed", 0, f"unreadable X-PD-KV-Reuse header {value.strip()!r}: {why}")


@dataclass(frozen=True)
class KvChoice:
    """One X-PD-KV-Choice value (a warm turn's source as the cost model chose it)."""

    source: str
    basis: str = "default"
    predicted_ms: float | None = None
    refused: str | None = None

    @property
    def header(self) -> str:
        predicted = f";predicted_ms={self.predicted_ms:.1f}" if self.predicted_ms is not None else ""
        refused = f";refused={self.refused}" if self.refused else ""
        return f"{self.source};basis={self.basis}{predicted}{refused}"

    def raw(self) -> tuple[bytes, bytes]:
        return KV_CHOICE_HEADER.encode(), self.header.encode()

    @classmethod
    def parse(cls, value: str | None) -> KvChoice | None:
        """None when absent (a cold turn, a router without the model) or unreadable; never raises."""
        if value is None or not value.strip():
            return None
        source, *params = (p.strip() for p in value.split(";"))
        if not source or "=" in source:
            return None
        fields = dict(p.partition("=")[::2] for p in params if "=" in p)
        return cls(source, fields.get("basis", "default"), parse_ms(fields.get("predicted_ms")),
                   fields.get("refused") or None)


def raw_ms(name: str, ms: float) -> tuple[bytes, bytes]:
    """An X-PD-*-Ms header as the router writes it (one decimal), as the (name, value) pair ASGI sends."""
    return name.encode(), f"{ms:.1f}".encode()


def parse_ms(value: str | None) -> float | None:
    """An X-PD-*-Ms header; None when absent or not a number."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


__all__ = [
    "DECODE_CACHE",
    "DECODE_LOCAL",
    "DECODE_MS_HEADER",
    "DECODE_READ",
    "DECODE_RESTARTED",
    "D_TO_P",
    "EVICTED",
    "EXPIRED",
    "HANDLE_IN_USE",
    "KV_CHOICE_HEADER",
    "KV_SOURCES",
    "NEW_CONVERSATION",
    "NOT_ELIGIBLE",
    "NO_HANDLE_RETURNED",
    "N_GT_1",
    "PREFILL_CACHE",
    "PREFILL_CACHED",
    "PREFILL_FAILED",
    "PREFILL_MS_HEADER",
    "PREFILL_REDONE",
    "PREFILL_UNCHECKED",
    "PREFILL_WHOLE",
    "PREFIX_DIVERGED",
    "PREFIX_SPEC_INVALID",
    "PREVIOUS_TURN_FAILED",
    "PROMPT_NOT_LONGER",
    "P_TO_D",
    "READ_NOT_WORTH",
    "REASONS",
    "REASON_TEXT",
    "RECOMPUTED",
    "RELEASED",
    "REUSE_HEADER",
    "REUSE_PAIRS",
    "ROUTER_IN_MS_HEADER",
    "TOKENIZE_FAILED",
    "TOKENS_UNKNOWN",
    "UNVERIFIED",
    "VERIFIED",
    "WHOLE_PREFILL",
    "DecodeRetention",
    "KvChoice",
    "KvChoiceStats",
    "Members",
    "Outcome",
    "ReadOutcome",
    "RetentionStats",
    "Reuse",
    "RouterStats",
    "UpstreamStats",
    "kv_source",
    "parse_ms",
    "raw_ms",
]
