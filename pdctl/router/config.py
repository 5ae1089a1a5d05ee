"""Every router knob in one frozen dataclass, with the defaults `pdctl router serve` uses."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdctl.errors import UsageError
from pdctl.kv_expiry import ENGINE_EXPIRY_MARGIN_S, ROUTER_EXPIRY_MARGIN_S, handle_lifetime
from pdctl.router.identity import DEFAULT_HEADERS
from pdctl.router.placement import POLICIES, LocalPolicy


@dataclass(frozen=True)
class RouterConfig:
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    model: str = "default"
    block_size: int = 16
    handle_ttl: float = 450.0
    decoder_kv_blocks_ttl: float = 480.0
    expiry_margin: float = ROUTER_EXPIRY_MARGIN_S
    verify_prefix: bool = True
    partial_reuse: bool = True
    # Conditional disaggregation on by default: on the simulated 1P1D and 2P2D it holds the most agent sessions within
    # p90 TTFT <= 500 ms (docs/results/sim-capacity); 0 turns it off (every warm turn through a prefill).
    local_prefill_tokens: int = 4096
    local_policy: LocalPolicy = "always"
    local_busy_streams: int = 4
    api_key: str | None = field(default=None, repr=False)
    engine_key: str | None = field(default=None, repr=False)
    """Sent to the engines as `Authorization: Bearer`; they refuse everyone else."""
    max_body_bytes: int = 32 * 1024 * 1024
    max_handles: int = 4096
    sweep_interval: float = 5.0
    health_interval: float = 2.0
    eject_after: int = 3
    load_factor: float = 1.25
    connect_timeout: float = 5.0
    request_timeout: float = 600.0
    max_connections: int = 2048
    max_inflight_per_instance: int = 256
    max_queue: int = 1024
    queue_timeout: float = 30.0
    health_timeout: float = 5.0
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    idle_timeout: float = 30.0
    max_client_connections: int = 0  # 0: half the router's open-file limit
    max_header_bytes: int = 64 * 1024
    max_headers: int = 256
    conversation_headers: tuple[str, ...] = DEFAULT_HEADERS

    def __post_init__(self) -> None:
        problems = []
        if not self.prefill:
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
        elif self.decoder_kv_blocks_ttl - self.expiry_margin <= 0:
            problems.append(
                f"--expiry-margin ({self.expiry_margin:g}s) must be below --decoder-kv-blocks-ttl "
                f"({self.decoder_kv_blocks_ttl:g}s), or no handle would ever be usable"
            )
        if self.local_prefill_tokens < 0:
            problems.append(f"--local-prefill-tokens must be >= 0, got {self.local_prefill_tokens}")
        if self.local_policy not in POLICIES:
            problems.append(f"--local-policy must be one of {', '.join(POLICIES)}, got {self.local_policy!r}")
        if self.local_busy_streams < 1:
            problems.append(f"--local-busy-streams must be >= 1, got {self.local_busy_streams}")
        for name in ("max_inflight_per_instance", "max_queue", "max_header_bytes", "max_headers"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("queue_timeout", "health_timeout", "header_timeout", "body_timeout", "idle_timeout"):
            if not getattr(self, name) > 0:
                problems.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name):g}")
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
