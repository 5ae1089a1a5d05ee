"""Every router knob in one frozen dataclass: its type, default and help, from which `router serve`'s options are
derived (pdctl.router.server.options). Defaults the topology shares come from pdctl.defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

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
    VERIFY_AT,
    VERIFY_PREFIX,
    VLLM_BLOCK_SIZE,
    VLLM_DECODER_KV_BLOCKS_TTL_S,
)
from pdctl.errors import UsageError
from pdctl.kv_expiry import ENGINE_EXPIRY_MARGIN_S, ROUTER_EXPIRY_MARGIN_S, handle_lifetime, leaves_no_handle

# Where a warm turn runs under load (turn/placement.py says what each policy does).
LocalPolicy = Literal["always", "load", "work", "cost"]
POLICIES: tuple[LocalPolicy, ...] = ("always", "load", "work", "cost")
# The headers a conversation id is read from, first match wins (server/conversation_headers.py).
DEFAULT_HEADERS = ("x-conversation-id", "x-session-id", "x-litellm-session-id", "x-session-affinity",
                   "x-correlation-id")
T = TypeVar("T")
VerifyAt = Literal["prefill", "router"]
RouterMode = Literal["disaggregated", "aggregated"]


def knob(default: T, help: str, *, flag: str | None = None) -> T:
    """A field with its option's help (and its flag, where it is not the field's name)."""
    return field(default=default, metadata=_meta(help, flag))


def _meta(help: str, flag: str | None = None) -> dict[str, Any]:
    return {"help": help, "flag": flag}


@dataclass(frozen=True)
class RouterConfig:
    prefill: tuple[str, ...] = knob((), "Prefill instance URL (repeat for more).")
    decode: tuple[str, ...] = knob((), "Decode instance URL (repeat for more); --mode aggregated: each engine's.")
    mode: RouterMode = knob(  # noqa: RUF009 (ruff cannot tell the alias is immutable)
        "disaggregated",
        "disaggregated: each turn through a prefill and a decode, with KV transfer between them; aggregated: every "
        "--decode is a whole engine (prefix caching, no KV connector, no --prefill) and each request goes whole "
        "to one, a conversation's later turns to the engine that served its last one, a new one to the least "
        "loaded.",
    )
    members_file: str | None = knob(
        None,
        "JSON file of the members ({\"prefill\": [URL...], \"decode\": [URL...], \"draining\": [URL...]}); read at "
        "start where it exists (instead of --prefill and --decode) and again on SIGHUP: new members join, draining "
        "ones take no new turns (their handles are released), members left out go once idle. `pdctl up` writes it.",
    )
    model: str = knob("default", "Served model name (used for /tokenize).")
    block_size: int = knob(VLLM_BLOCK_SIZE, "KV block size in tokens (partial reuse is whole blocks).")
    handle_ttl: float = knob(HANDLE_TTL_S, "Seconds the router trusts a decode handle.")
    decoder_kv_blocks_ttl: float = knob(
        float(VLLM_DECODER_KV_BLOCKS_TTL_S),
        "The decodes' decoder_kv_blocks_ttl: how long they keep a finished turn's blocks.",
    )
    expiry_margin: float = knob(
        ROUTER_EXPIRY_MARGIN_S,
        f"Seconds before decoder_kv_blocks_ttl that a handle stops being used (at least the engine's own "
        f"{ENGINE_EXPIRY_MARGIN_S:g} s).",
    )
    verify_prefix: bool = knob(VERIFY_PREFIX, "Reuse only KV whose token ids match.")
    partial_reuse: bool = knob(True, "On divergence reuse the verified blocks.")
    verify_at: VerifyAt = knob(  # noqa: RUF009 (ruff cannot tell the alias is immutable)
        VERIFY_AT,
        "Where the prefix is verified: prefill (the prefill checks the router's digests of the held tokens against "
        "its own tokenization before it reads; vLLM needs pdctl's patch, else every warm turn is a miss, "
        "prefill_unchecked) or router (a /tokenize of the whole prompt before the prefill hop). Token ids: "
        "the router, either way.",
    )
    min_read_tokens: int = knob(
        MIN_READ_TOKENS,
        "The cheapest source of a warm turn's history: its prefill reads the decode's KV only for at least this "
        "many tokens beyond what the prefill's own prefix cache holds (fewer it computes: reason prefill_cached); "
        "0: read whatever it lacks.",
    )
    local_prefill_tokens: int = knob(
        LOCAL_PREFILL_TOKENS,
        "Conditional disaggregation: a turn whose decode already holds all but at most this many of the prompt's "
        "tokens is computed there, without the prefill hop (text: its new bytes at the conversation's own tokens per "
        "byte, learned from the decode's token ids; else its bytes bound its tokens); 0: always "
        "disaggregate. Needs --verify-prefix.",
    )
    local_policy: LocalPolicy = knob(  # noqa: RUF009 (ruff cannot tell the alias is immutable)
        LOCAL_POLICY,
        "Which of those turns run on the decode: always; load (while the decode has fewer than "
        "--local-busy-streams requests in flight, or the prefill has at least as many as the decode); work "
        "(while its prompt tokens in flight are at most the prefill's plus the hop's cost); or cost (the source "
        "with the least predicted time to first token, from rates the router measures, never one whose step would "
        "break --itl-slo-ms or --local-stall-ratio; load until the rates are measured).",
    )
    local_busy_streams: int = knob(
        LOCAL_BUSY_STREAMS, "--local-policy load: requests in flight from which a decode counts as busy."
    )
    itl_slo_ms: float = knob(
        ITL_SLO_MS,
        "--local-policy cost: the decode's inter-token latency budget (ms). A warm turn whose prefill on its decode "
        "would make that decode's step (its other streams' ITL) longer than this goes through a prefill.",
    )
    local_stall_ratio: float = knob(
        LOCAL_STALL_RATIO,
        "--local-policy cost: the most a warm turn on its decode alone may lengthen the step of that decode's other "
        "streams, against the largest gap they see anyway (a turn through a prefill stalls them not at all); beside "
        "other streams, unmeasured rates send it through a prefill. 0: no such bound, --itl-slo-ms alone (more warm "
        "turns local: lower TTFT, longer gaps for the other streams; docs/router.md): a busy decode's local costs are "
        "measured by probes, and the least TTFT within that budget is chosen.",
    )
    decode_batch_tokens: int = knob(
        0,
        "--local-policy cost: the most tokens a decode's step computes (its max_num_batched_tokens; pdctl up "
        "passes the decodes' smallest). A local turn's prompt is computed in chunks of that less a token per "
        "stream, each a bounded stall in the other streams' step. 0: not known (a whole prompt in one step).",
    )
    api_key: str | None = field(default=None, repr=False)
    """The key clients must send; given as --api-key-env, never in argv."""
    engine_key: str | None = field(default=None, repr=False)
    """Sent to the engines as `Authorization: Bearer`; they refuse everyone else. Given as --engine-key-file."""
    max_body_bytes: int = knob(32 * 1024 * 1024, "Larger request bodies get 413.")
    max_handles: int = knob(4096, "Most decode handles kept (least recently used go).")
    release: bool = knob(
        True,
        "Free the decode KV of handles no turn will read (replaced, evicted, expired, unread, over the pin "
        "budget) with a one-token request to a prefill, instead of leaving it pinned for decoder_kv_blocks_ttl.",
    )
    pin_budget_tokens: int = knob(
        PIN_BUDGET_TOKENS,
        "Tokens of KV the live handles may pin on one decode; past it the decode's least recently used handles "
        "are released (the next turn of theirs is a miss, released). 0: --pin-budget-fraction of the decode's KV.",
    )
    pin_budget_fraction: float = knob(
        PIN_BUDGET_FRACTION,
        "With --pin-budget-tokens 0: the budget is this fraction of each decode's KV capacity (num_gpu_blocks x "
        "block_size, from its /metrics vllm:cache_config_info, read once per decode process). 0: no budget.",
    )
    overflow_kv: float = knob(
        OVERFLOW_KV,
        "Overflow to the prefill: a turn whose decode's KV use (its /metrics vllm:kv_cache_usage_perc, polled, plus "
        "what the router sent since, plus the turn) is above this fraction runs whole on the prefill with the least "
        "KV use below it (a plain completion, no KV transfer), and its conversation's later turns stay there while "
        "that prefill is below it. 0: off.",
    )
    retain_high_kv: float = knob(
        RETAIN_HIGH_KV,
        "Retained KV yields to new work: a decode whose own KV use (its /metrics vllm:kv_cache_usage_perc, polled a "
        "few times a second) is above this fraction makes the router release its retained handles there, least "
        "valuable first (conversations that never took a second turn, then the oldest, then the shortest), down to "
        "--retain-target-kv; so do requests waiting on a decode above --retain-target-kv. 0: off.",
    )
    retain_target_kv: float = knob(
        RETAIN_TARGET_KV, "Where releasing under KV pressure stops (a fraction of the decode's KV, below "
        "--retain-high-kv).",
    )
    state_dir: str | None = knob(
        None,
        "The deployment's state directory on this node: each router keeps a journal of the decode KV it pins in "
        "kv-journal/ there, and at start releases what earlier routers of the deployment pinned and no longer hold "
        "(a crashed or restarted one's; a live sibling's journal is locked and left alone). Unset: no journal.",
    )
    shutdown_release_timeout: float = knob(
        5.0, "On SIGTERM the router releases every pin it holds, waiting at most this many seconds; what is left "
        "stays in its journal for the next router to release. 0: leave them to the next router.",
    )
    release_concurrency: int = knob(4, "Releases in flight at once (they run in the background, off every turn).")
    release_carry_ms: float = knob(
        50.0, "How long a release waits for a turn's own prefill request to carry it (a turn that reads nothing from "
        "a decode: no request added) before it is sent alone. 0: every release is a request of its own.")
    release_calm_carry_s: float = knob(
        30.0, "How long the release of a handle evicted from a full table, or expired, waits for a turn to carry it "
        "while its decode's KV is calm (its last poll at or below retain_target_kv, nothing waiting): blocks nothing "
        "needs are not worth a request of their own. Never past 5 s before the decode's TTL frees them; pressure, "
        "a drain or a stop sends it at once; release_carry_ms where this is smaller.")
    sweep_interval: float = knob(5.0, "Seconds between sweeps of expired handles.")
    health_interval: float = knob(2.0, "Seconds between upstream health checks.")
    eject_after: int = knob(3, "Consecutive failures that eject an upstream.")
    load_factor: float = knob(1.25, "Bounded-load cap, x the mean outstanding requests.")
    connect_timeout: float = knob(5.0, "Seconds to open a connection to an upstream.")
    request_timeout: float = knob(600.0, "Seconds an upstream may take to answer.")
    max_connections: int = knob(2048, "Idle connections kept open to each upstream.")
    max_inflight_per_instance: int = knob(256, "Requests in flight per healthy instance before new ones queue.")
    max_queue: int = knob(1024, "Queued requests per role before 429 + Retry-After.")
    queue_timeout: float = knob(30.0, "Seconds a request may queue before 503 + Retry-After.")
    health_timeout: float = knob(
        5.0, "Seconds a health check waits; a timeout never ejects a role's last instance."
    )
    header_timeout: float = knob(10.0, "Seconds a client has to send a request's headers.")
    body_timeout: float = knob(60.0, "Seconds a client has to send a request's body.")
    idle_timeout: float = knob(30.0, "Seconds an idle client connection stays open.")
    max_client_connections: int = knob(
        0, "Open client connections before new ones get 503; 0: half the router's open-file limit."
    )
    max_header_bytes: int = knob(64 * 1024, "Larger request heads get 431.")
    max_headers: int = knob(256, "More request headers than this get 431.")
    otlp_endpoint: str | None = knob(
        None,
        "OpenTelemetry traces (off when unset): the OTLP/HTTP collector, e.g. http://collector:4318 (spans go to "
        "/v1/traces there); one trace per turn, a span per stage, the client's traceparent as parent. Collector "
        "headers: OTEL_EXPORTER_OTLP_HEADERS.",
    )
    otlp_service_name: str = knob("pdctl-router", "The service.name of the router's traces.")
    trace_queue: int = knob(2048, "Finished traces waiting for export; past it new ones are dropped (counted).")
    conversation_headers: tuple[str, ...] = knob(
        DEFAULT_HEADERS,
        "Header naming a request's conversation, in order of precedence (repeat for more).",
        flag="--conversation-header",
    )

    def __post_init__(self) -> None:
        problems = []
        aggregated = self.mode == "aggregated"
        if self.mode not in ("disaggregated", "aggregated"):
            problems.append(f"--mode must be disaggregated or aggregated, got {self.mode!r}")
        if aggregated and self.prefill:
            problems.append("--mode aggregated takes no --prefill URL (every --decode is a whole engine)")
        elif not self.prefill and not aggregated:
            problems.append("at least one --prefill URL is needed")
        if not self.decode:
            problems.append("at least one --decode URL is needed")
        if self.block_size < 1:
            problems.append(f"--block-size must be >= 1, got {self.block_size}")
        if self.handle_ttl <= 0:
            problems.append(f"--handle-ttl must be > 0, got {self.handle_ttl:g}")
        if self.expiry_margin < ENGINE_EXPIRY_MARGIN_S:
            problems.append(
                f"--expiry-margin ({self.expiry_margin:g}s) must be at least the engine's own "
                f"{ENGINE_EXPIRY_MARGIN_S:g}s (vLLM's prefill declines reads of a handle that close to expiry)"
            )
        elif leaves_no_handle(self.decoder_kv_blocks_ttl, self.expiry_margin):
            problems.append(
                f"--expiry-margin ({self.expiry_margin:g}s) must be below --decoder-kv-blocks-ttl "
                f"({self.decoder_kv_blocks_ttl:g}s), or no handle would ever be usable"
            )
        if self.min_read_tokens < 0:
            problems.append(f"--min-read-tokens must be >= 0, got {self.min_read_tokens}")
        if self.local_prefill_tokens < 0:
            problems.append(f"--local-prefill-tokens must be >= 0, got {self.local_prefill_tokens}")
        if self.local_policy not in POLICIES:
            problems.append(f"--local-policy must be one of {', '.join(POLICIES)}, got {self.local_policy!r}")
        if self.verify_at not in ("prefill", "router"):
            problems.append(f"--verify-at must be prefill or router, got {self.verify_at!r}")
        if self.pin_budget_tokens < 0:
            problems.append(f"--pin-budget-tokens must be >= 0, got {self.pin_budget_tokens}")
        if not 0 <= self.pin_budget_fraction <= 1:
            problems.append(f"--pin-budget-fraction must be between 0 and 1, got {self.pin_budget_fraction:g}")
        if not 0 <= self.overflow_kv <= 1:
            problems.append(f"--overflow-kv must be between 0 and 1, got {self.overflow_kv:g}")
        if not 0 <= self.retain_high_kv <= 1:
            problems.append(f"--retain-high-kv must be between 0 and 1, got {self.retain_high_kv:g}")
        elif self.retain_high_kv and not 0 < self.retain_target_kv < self.retain_high_kv:
            problems.append(f"--retain-target-kv must be above 0 and below --retain-high-kv "
                            f"({self.retain_high_kv:g}), got {self.retain_target_kv:g}")
        if self.shutdown_release_timeout < 0:
            problems.append(f"--shutdown-release-timeout must be >= 0, got {self.shutdown_release_timeout:g}")
        if not self.release_carry_ms >= 0:
            problems.append(f"--release-carry-ms must be >= 0 (0: never carried), got {self.release_carry_ms:g}")
        if not self.release_calm_carry_s >= 0:
            problems.append(f"--release-calm-carry-s must be >= 0, got {self.release_calm_carry_s:g}")
        if self.release_concurrency < 1:
            problems.append(f"--release-concurrency must be >= 1, got {self.release_concurrency}")
        if not self.itl_slo_ms > 0:
            problems.append(f"--itl-slo-ms must be > 0, got {self.itl_slo_ms:g}")
        if not self.local_stall_ratio >= 0:
            problems.append(f"--local-stall-ratio must be >= 0 (0: no stall bound), got {self.local_stall_ratio:g}")
        if self.decode_batch_tokens < 0:
            problems.append(f"--decode-batch-tokens must be >= 0 (0: not known), got {self.decode_batch_tokens}")
        if self.local_busy_streams < 1:
            problems.append(f"--local-busy-streams must be >= 1, got {self.local_busy_streams}")
        for name in ("max_inflight_per_instance", "max_queue", "max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("queue_timeout", "health_timeout", "header_timeout", "body_timeout", "idle_timeout"):
            if not getattr(self, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name):g}")
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            problems.append(f"--otlp-endpoint {self.otlp_endpoint!r} must start with http:// or https://")
        if self.trace_queue < 1:
            problems.append(f"--trace-queue must be >= 1, got {self.trace_queue}")
        if self.max_client_connections < 0:
            problems.append(f"--max-client-connections must be >= 0, got {self.max_client_connections}")
        if self.load_factor < 1:
            problems.append(f"--load-factor must be >= 1, got {self.load_factor:g}")
        for url in (*self.prefill, *self.decode):
            if not url.startswith(("http://", "https://")):
                problems.append(f"upstream URL {url!r} must start with http:// or https://")
        for name in self.conversation_headers:
            if not name or not all(c.isalnum() or c in "-_" for c in name):
                problems.append(f"--conversation-header {name!r} is not an HTTP header name")
        if problems:
            raise UsageError("invalid router options: " + "; ".join(problems), hint="see `pdctl router serve --help`")

    @property
    def handle_lifetime(self) -> float:
        """Seconds a handle stays usable after the router received it, by the router's own clock."""
        return handle_lifetime(self.handle_ttl, self.decoder_kv_blocks_ttl, self.expiry_margin)
