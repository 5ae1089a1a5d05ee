"""The topology's `router` section: where the router runs and how it places, verifies and releases turns."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pdctl.defaults import (
    HANDLE_TTL_S,
    ITL_SLO_MS,
    LOCAL_BUSY_STREAMS,
    LOCAL_POLICY,
    LOCAL_PREFILL_TOKENS,
    LOCAL_STALL_RATIO,
    MIN_READ_TOKENS,
    OVERFLOW_KV,
    PIN_BUDGET_FRACTION,
    PIN_BUDGET_TOKENS,
    RETAIN_HIGH_KV,
    RETAIN_TARGET_KV,
    ROUTER_PORT,
    VERIFY_AT,
    VERIFY_PREFIX,
)
from pdctl.topology.strict import Strict
from pdctl.topology.strings import (
    Address,
    EnvKey,
    HostPath,
    NodeName,
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
    min_read_tokens: int = Field(
        MIN_READ_TOKENS,
        ge=0,
        description="The cheapest source of a warm turn's history: a prefill reads the decode's KV only for at "
        "least this many tokens beyond what its own prefix cache holds, and computes fewer itself (reason "
        "prefill_cached); 0: read whatever it lacks.",
    )
    local_prefill_tokens: int = Field(
        LOCAL_PREFILL_TOKENS,
        ge=0,
        description="Conditional disaggregation: a turn whose decode already caches all but at most this many of "
        "the prompt's tokens runs on that decode alone, skipping the prefill hop and both KV transfers (it costs "
        "the decode's other streams one step of that many tokens); 0: always disaggregate. Default 4096 (0 "
        "with verify_prefix: false).",
    )
    local_policy: Literal["always", "load", "work", "cost"] = Field(
        LOCAL_POLICY,
        description="Which of those turns run on the decode: always; load (only while the decode has fewer "
        "than local_busy_streams requests in flight, or when the prefill has as many); work (while the prompt "
        "tokens in flight on the decode are at most the prefill's plus the hop's cost, else through the prefill); "
        "or cost (the default: the source with the least predicted time to first token, from rates the router "
        "measures, never one that breaks itl_slo_ms or local_stall_ratio; as load until measured).",
    )
    local_busy_streams: int = Field(
        LOCAL_BUSY_STREAMS, ge=1, description="local_policy load: a decode with this many requests in flight is busy."
    )
    itl_slo_ms: float = Field(
        ITL_SLO_MS,
        gt=0,
        description="local_policy cost: the decode's inter-token latency budget in ms. A warm turn whose prefill on "
        "its decode would stall that decode's other streams for longer than this goes through a prefill instead. "
        "On simulated engines it is modelled time: the router, which times their steps in wall time, is given "
        "itl_slo_ms / sim.speed. pdctl bench --slo itl_p99=MS sets it for the legs it deploys.",
    )
    local_stall_ratio: float = Field(
        LOCAL_STALL_RATIO,
        ge=0,
        description="local_policy cost: the most a warm turn on its decode alone may lengthen the step of that "
        "decode's other streams, against the largest gap they see anyway (default 1.2: their worst gaps stay near "
        "ON via prefill's). A decode whose max_num_batched_tokens is set computes the turn in chunks of it, each a "
        "bounded stall (docs/router.md). Until the decode's rates are measured a turn beside other streams goes "
        "through a prefill unless its stall a step, priced at twice the prefill's compute, keeps the step within the "
        "bounds: a probe. "
        "0: no such bound, itl_slo_ms alone: a busy decode's local costs are measured by probes (one local turn "
        "at a time) and the least TTFT within that budget is chosen. On one "
        "real H100 under eviction, warm TTFT p90 102-111 ms against OFF's 484-489 at 9 agent sessions, ITL p99 "
        "68-72 ms (an 8B model); on simulated engines modelled on a 32B model it broke the ITL SLO at 12 sessions "
        "(docs/results/h100-1gpu-evict, docs/router.md).",
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
    retain_high_kv: float = Field(
        RETAIN_HIGH_KV,
        ge=0,
        le=1,
        description="Retained KV yields to new work (disaggregated mode): when a decode's own KV use (its "
        "vllm:kv_cache_usage_perc, which the router polls a few times a second) is above this fraction, the router "
        "releases the KV it keeps there for next turns, least valuable first (conversations that never took a "
        "second turn, then the oldest, then the shortest), down to retain_target_kv; so do requests waiting on a "
        "decode above retain_target_kv, and while they wait a conversation that never continued is not kept there at "
        "all. A released conversation's next turn recomputes its history (a miss, reason released). 0: off "
        "(docs/kv-retention.md).",
    )
    retain_target_kv: float = Field(
        RETAIN_TARGET_KV,
        gt=0,
        lt=1,
        description="Where releasing under KV pressure stops: a fraction of the decode's KV, below retain_high_kv.",
    )

    replicas: int = Field(
        1, ge=1, le=64,
        description="Routers to run: more than 1 puts them behind an HAProxy that pdctl configures and starts on "
        "`node`, listening on `port` and hashing each conversation (consistently) to one router; the routers "
        "share nothing, each reuses only the KV of the turns it placed (docs/router-replicas.md).",
    )
    replica_nodes: list[NodeName] | None = Field(
        None, min_length=1,
        description="With replicas > 1: the nodes the routers run on, router-i on the (i mod n)-th; default: `node`.",
    )
    replica_port: int | None = Field(
        None, ge=1, le=65535,
        description="With replicas > 1: the first router's port on each of its nodes, the next ones above it; "
        "default: port + 1.",
    )
    lb_binary: HostPath = Field(
        "/usr/sbin/haproxy",
        description="With replicas > 1: the HAProxy (>= 2.6) binary on `node` (Debian/Ubuntu: `apt-get install "
        "haproxy`).",
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

    def replica_places(self) -> list[tuple[str, int]]:
        """(node, port) of router-0 .. router-(replicas-1); empty with one router (it listens on `port`)."""
        if self.replicas < 2:
            return []
        nodes = self.replica_nodes or [self.node]
        base = self.replica_port or self.port + 1
        placed: list[tuple[str, int]] = []
        for i in range(self.replicas):
            node = nodes[i % len(nodes)]
            placed.append((node, base + sum(1 for n, _ in placed if n == node)))
        return placed

    @model_validator(mode="before")
    @classmethod
    def _local_off_without_ids(cls, data: Any) -> Any:
        """The default needs the prompt's ids; without verify_prefix it is 0 rather than an error."""
        if isinstance(data, dict) and data.get("verify_prefix") is False and "local_prefill_tokens" not in data:
            return {**data, "local_prefill_tokens": 0}
        return data

    @model_validator(mode="after")
    def _retain_target_below_high(self) -> Router:
        if self.retain_high_kv and self.retain_target_kv >= self.retain_high_kv:
            raise ValueError(f"retain_target_kv ({self.retain_target_kv:g}) must be below retain_high_kv "
                             f"({self.retain_high_kv:g}): releasing under pressure stops at the target")
        return self

    @model_validator(mode="after")
    def _local_needs_ids(self) -> Router:
        if self.local_prefill_tokens and not self.verify_prefix:
            raise ValueError("local_prefill_tokens needs verify_prefix: true (it counts the prompt's cached tokens)")
        return self
