"""The topology's `router` section: where the router runs and how it places, verifies and releases turns."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pdctl.defaults import (
    HANDLE_TTL_S,
    LOCAL_BUSY_STREAMS,
    LOCAL_POLICY,
    LOCAL_PREFILL_TOKENS,
    OVERFLOW_KV,
    PIN_BUDGET_FRACTION,
    PIN_BUDGET_TOKENS,
    ROUTER_PORT,
    VERIFY_AT,
    VERIFY_PREFIX,
)
from pdctl.topology.strict import Strict
from pdctl.topology.strings import (
    Address,
    EnvKey,
)


class Router(Strict):
    node: str = Field(description="Node that runs the router.")
    port: int = Field(ROUTER_PORT, ge=1, le=65535, description="Port clients connect to.")
    bind: Address | None = Field(None, description="Address to listen on; default: the node's address.")
    handle_ttl: float = Field(HANDLE_TTL_S, gt=0, description="Seconds the router trusts a decode handle.")
    api_key_env: EnvKey | None = Field(None, description="Env var holding the API key clients must send.")
    verify_prefix: bool = Field(VERIFY_PREFIX, description="Reuse only KV whose tokens match the new prompt.")
    verify_at: Literal["prefill", "router"] = Field(
        VERIFY_AT,
        description="Where the prefix is verified: prefill (the prefill checks the router's digests of the held "
        "tokens against its own tokenization, before it reads anything; pdctl patches vLLM for it) or router (a "
        "/tokenize of the whole prompt on the critical path, for a vLLM pdctl cannot patch).",
    )
    local_prefill_tokens: int = Field(
        LOCAL_PREFILL_TOKENS,
        ge=0,
        description="Conditional disaggregation: a turn whose decode already caches all but at most this many of "
        "the prompt's tokens runs on that decode alone, skipping the prefill hop and both KV transfers (it costs "
        "the decode's other streams one step of that many tokens); 0: always disaggregate. Default 4096 (0 "
        "with verify_prefix: false).",
    )
    local_policy: Literal["always", "load", "work"] = Field(
        LOCAL_POLICY,
        description="Which of those turns run on the decode: always; load (only while the decode has fewer "
        "than local_busy_streams requests in flight, or when the prefill has as many); or work (while the prompt "
        "tokens in flight on the decode are at most the prefill's plus the hop's cost, else through the prefill).",
    )
    local_busy_streams: int = Field(
        LOCAL_BUSY_STREAMS, ge=1, description="local_policy load: a decode with this many requests in flight is busy."
    )

    release: bool = Field(
        True,
        description="Free the decode KV of handles no turn will read (replaced, evicted, expired, over "
        "pin_budget_tokens) with a one-token request to a prefill that tells the decode to free it, rather than "
        "leaving it pinned for the decode's decoder_kv_blocks_ttl.",
    )
    pin_budget_tokens: int = Field(
        PIN_BUDGET_TOKENS,
        ge=0,
        description="Tokens of KV the router's live handles may pin on one decode; a handle that takes a decode "
        "past it releases that decode's least recently used handles (their next turn is a miss, released). "
        "0 (the default): pin_budget_fraction of the decode's KV.",
    )
    pin_budget_fraction: float = Field(
        PIN_BUDGET_FRACTION,
        ge=0,
        le=1,
        description="With pin_budget_tokens 0: the budget is this fraction of each decode's KV (num_gpu_blocks x "
        "block_size, which the router reads from the decode's /metrics). Default 0.5: the other half stays for the "
        "turns the decode runs. 0: no budget (dropped handles are still released).",
    )
    overflow_kv: float | None = Field(
        OVERFLOW_KV,
        ge=0,
        le=1,
        description="Overflow to the prefill (disaggregated mode): a turn whose decode's KV use (the engine's "
        "vllm:kv_cache_usage_perc, polled by the router, plus what it sent since and the turn) is above this "
        "fraction runs whole on the prefill with the least KV use below it (a plain completion, no KV transfer), "
        "and its conversation's later turns stay on that prefill while it is below it. 0 or null: off.",
    )

    otlp_endpoint: str | None = Field(
        None,
        pattern=r"^https?://",
        description="OpenTelemetry traces of every turn (one span per turn, a child per stage, the client's W3C "
        "traceparent as parent): the OTLP/HTTP collector the router exports to, e.g. http://collector:4318 (spans "
        "go to /v1/traces). Headers for it (an API key): OTEL_EXPORTER_OTLP_HEADERS in env.router. null: off.",
    )

    conversation_headers: list[str] | None = Field(
        None,
        description="Headers naming a request's conversation, in order of precedence (after the body's "
        "conversation_id); null: the router's own list (see `pdctl router serve --help`).",
    )

    @model_validator(mode="before")
    @classmethod
    def _local_off_without_ids(cls, data: Any) -> Any:
        """The default needs the prompt's ids; without verify_prefix it is 0 rather than an error."""
        if isinstance(data, dict) and data.get("verify_prefix") is False and "local_prefill_tokens" not in data:
            return {**data, "local_prefill_tokens": 0}
        return data

    @model_validator(mode="after")
    def _local_needs_ids(self) -> Router:
        if self.local_prefill_tokens and not self.verify_prefix:
            raise ValueError("local_prefill_tokens needs verify_prefix: true (it counts the prompt's cached tokens)")
        return self
