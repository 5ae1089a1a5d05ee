"""What a bench run produces: one record per request, and per leg its settings, KV transfer and guard results.

Field names follow vLLM's multi-turn benchmark (`--stats-json-output`) where they exist: `ttft_ms`, `tpot_ms`,
`latency_ms`, `start_time_ms`, `input_num_turns`, `input_num_tokens`, `output_num_tokens`, `output_num_chunks`,
`conversation_id`, `client_id`. `turn` counts from 0 (turn 0 is the cold first turn).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pdctl.router.wire import RouterStats, kv_source


@dataclass
class RequestRecord:
    leg: str
    length: int
    conversation_id: str
    turn: int
    api: str
    client_id: int = 0
    status: int = 0
    error: str | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_max_ms: float | None = None  # the largest gap between two streamed chunks: a stall TPOT averages away
    latency_ms: float | None = None
    start_time_ms: float = 0.0
    input_num_turns: int = 1
    input_num_tokens: int | None = None
    input_tokens_source: str = "usage"
    output_num_tokens: int = 0
    output_num_chunks: int = 0
    prefill_ms: float | None = None
    router_in_ms: float | None = None  # the router's X-PD-Router-In-Ms (stages.py)
    decode_ms: float | None = None  # the router's X-PD-Decode-Ms: decode request to first byte
    reuse: str | None = None
    reuse_tokens: int | None = None
    reuse_reason: str | None = None
    reuse_read: int | None = None  # tokens the prefill read from the decode (X-PD-KV-Reuse read=)
    reuse_cached: int | None = None  # prompt tokens the prefill did not compute: cache hit + read (cached=)
    # The router's choice for a warm turn (X-PD-KV-Choice, pdctl.router.wire.KvChoice); None on a cold turn, an OFF
    # leg, an aggregated engine or a router that does not send it. `source` above says what then happened.
    kv_choice: str | None = None  # decode_cache, decode_read or recomputed
    kv_choice_basis: str | None = None  # model (the cost model) or default (its rates not yet measured)
    kv_choice_predicted_ms: float | None = None  # the model's predicted TTFT (basis model), beside ttft_ms
    kv_choice_refused: str | None = None  # why the decode alone was refused: itl, slower, cap
    request_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def source(self) -> str | None:
        """Where this turn's history KV came from (pdctl.router.wire.kv_source); None without a router's header."""
        if self.reuse not in ("hit", "partial", "miss"):
            return None
        return kv_source(self.reuse, self.reuse_reason or "", self.reuse_read, self.reuse_cached)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class KvTransfer:
    """KV transfer done by the prefill instances during one span (a leg, or one length of a leg)."""

    transfers: int = 0
    xfer_ms: float = 0.0
    bytes: float = 0.0
    descriptors: float = 0.0
    failed: int = 0
    expired: int = 0
    source: str = "none"

    @property
    def avg_xfer_ms(self) -> float:
        return self.xfer_ms / self.transfers if self.transfers else 0.0

    def __add__(self, other: KvTransfer) -> KvTransfer:
        source = self.source if other.source == "none" else other.source
        return KvTransfer(
            self.transfers + other.transfers,
            self.xfer_ms + other.xfer_ms,
            self.bytes + other.bytes,
            self.descriptors + other.descriptors,
            self.failed + other.failed,
            self.expired + other.expired,
            source,
        )


@dataclass
class LegResult:
    name: str
    overrides: list[str]
    bidirectional: bool
    simulated: bool
    records: list[RequestRecord] = field(default_factory=list)
    kv: KvTransfer = field(default_factory=KvTransfer)
    kv_by_length: dict[int, KvTransfer] = field(default_factory=dict)
    pull_by_length: dict[int, KvTransfer] = field(default_factory=dict)  # the decodes' P->D pulls
    router_stats: RouterStats | None = None  # the router's /stats at the end of the leg
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    mode: str = "disaggregated"  # aggregated: engines serving whole requests, the baseline
    engines: int = 1  # engine processes the leg ran (aggregated: one per decode instance)
    shape: str = ""  # 1P1D, 2P2D, 2 aggregated: what the leg deployed
    capacity: list[dict[str, Any]] = field(default_factory=list)  # capacity points (pdctl.bench.runner.capacity.Point)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "overrides": self.overrides,
            "bidirectional": self.bidirectional,
            "mode": self.mode,
            "engines": self.engines,
            **({"shape": self.shape} if self.shape else {}),
            "simulated": self.simulated,
            "passed": self.passed,
            "failures": self.failures,
            "wall_s": round(self.wall_s, 3),
            "kv_transfer": asdict(self.kv),
            "kv_transfer_by_length": {str(k): asdict(v) for k, v in self.kv_by_length.items()},
            "decode_pull_by_length": {str(k): asdict(v) for k, v in self.pull_by_length.items()},
            "router_stats": self.router_stats.to_json() if self.router_stats is not None else None,
            "requests": len(self.records),
            **({"capacity": self.capacity} if self.capacity else {}),
        }


@dataclass
class BenchResult:
    """A whole bench: its legs in order (the first is the baseline of every ratio) and how it was run."""

    topology: str
    simulated: bool
    workload: dict[str, Any]
    legs: list[LegResult] = field(default_factory=list)
    started_at: str = ""
    wall_s: float = 0.0
    interrupted: bool = False  # Ctrl-C: the legs hold what finished before it
    host: dict[str, Any] = field(default_factory=dict)  # this machine: cpus, load average at the start and end
    eviction: dict[str, Any] | None = None  # the eviction profile's sizing (pdctl.bench.runner.eviction.EvictionSize)
    # after the report: where the deployment was left ("as found", "down", "unknown") and the line saying so
    deployment_state: str = ""
    deployment: str = ""

    @property
    def passed(self) -> bool:
        return not self.interrupted and not self.restore_failed and all(leg.passed for leg in self.legs)

    @property
    def restore_failed(self) -> bool:
        """The deployment was left neither as found nor down on purpose (a Ctrl-C asks for down)."""
        return self.deployment_state == "unknown" or (self.deployment_state == "down" and not self.interrupted)

    @property
    def records(self) -> list[RequestRecord]:
        return [r for leg in self.legs for r in leg.records]
