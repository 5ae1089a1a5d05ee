"""The bench's figures from what the engines say about themselves (pdctl.engine_metrics reads their `/metrics` or
their `KV Transfer metrics` log lines into one shape): the prefills' KV transfer, and each engine's busy fraction,
prefill/decode tokens and KV high-water mark over a span (a capacity point), from the simulator's step counters.

A real vLLM has no such counters: its figures are then None, never a guess.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from pdctl.bench.leg.legs import Endpoints
from pdctl.bench.results.records import KvTransfer
from pdctl.engine_metrics import (
    NIXL_BYTES,
    NIXL_DESCRIPTORS,
    NIXL_EXPIRED,
    NIXL_FAILED,
    NIXL_XFER_COUNT,
    NIXL_XFER_SECONDS,
    Samples,
    kv_log_samples,
    parse_prometheus,
)
from pdctl.remote.base import Transport

SIM_STEP_MS = "pdctl_sim_step_modelled_ms_total"
SIM_STEPS = "pdctl_sim_steps_total"
SIM_PREFILL_TOKENS = "pdctl_sim_step_prefill_tokens_total"
SIM_DECODE_TOKENS = "pdctl_sim_step_decode_tokens_total"
SIM_KV_PEAK = "pdctl_sim_kv_blocks_peak"
SIM_KV_BLOCKS = "pdctl_sim_kv_num_gpu_blocks"


def nixl_delta(before: Samples, after: Samples, source: str = "metrics") -> KvTransfer:
    """KV transfer between two scrapes of the same instances (counters only grow; a restart reads as after)."""

    def d(name: str) -> float:
        a, b = after.get(name, 0.0), before.get(name, 0.0)
        return a - b if a >= b else a

    return KvTransfer(
        transfers=int(d(NIXL_XFER_COUNT)),
        xfer_ms=d(NIXL_XFER_SECONDS) * 1000.0,
        bytes=d(NIXL_BYTES),
        descriptors=d(NIXL_DESCRIPTORS),
        failed=int(d(NIXL_FAILED)),
        expired=int(d(NIXL_EXPIRED)),
        source=source,
    )


def kv_from_log(lines: Iterable[str]) -> KvTransfer:
    """Total KV transfer from every `KV Transfer metrics` line; averages are weighted by their transfer counts."""
    return nixl_delta({}, kv_log_samples(lines), source="log")


@dataclass(frozen=True)
class EngineUsage:
    """One engine over a span. `busy`: modelled step time / the span's modelled time (None: no step model).
    `kv_peak`: the most KV blocks in use at once since the engine started, as a fraction of its blocks;
    `kv_peak_in_span`: that mark rose during the span, so it is the span's own peak (else the span's is at most it).
    `steps`: how many steps that time took; each pays the step model's fixed part (base_ms), so a decoding engine
    is busy whenever a stream is, and its work beyond that is busy x span - steps x base_ms."""

    engine: str  # prefill-0, decode-0, or aggregated-0 (one per GPU)
    busy: float | None
    prefill_tokens: int | None
    decode_tokens: int | None
    kv_peak: float | None
    kv_peak_in_span: bool = False
    steps: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineUsage:
        return cls(**data)


def usage_delta(engine: str, before: Samples, after: Samples, span_ms: float) -> EngineUsage | None:
    """What one engine did between two scrapes `span_ms` (modelled) apart; None without any of the sim's counters
    (a real vLLM) or across a restart (the step counter went down)."""
    if SIM_KV_PEAK not in after and SIM_STEPS not in after:
        return None
    steps = SIM_STEPS in after and after[SIM_STEPS] >= before.get(SIM_STEPS, 0.0)

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    blocks = after.get(SIM_KV_BLOCKS, 0.0)
    peak = after.get(SIM_KV_PEAK)
    busy = d(SIM_STEP_MS) / span_ms if steps and span_ms > 0 else None
    return EngineUsage(
        engine=engine,
        busy=busy if busy is None or math.isfinite(busy) else None,
        prefill_tokens=int(d(SIM_PREFILL_TOKENS)) if steps else None,
        decode_tokens=int(d(SIM_DECODE_TOKENS)) if steps else None,
        kv_peak=peak / blocks if peak is not None and blocks > 0 else None,
        kv_peak_in_span=peak is not None and peak != before.get(SIM_KV_PEAK),  # it rose, or the engine restarted
        steps=int(d(SIM_STEPS)) if steps else None,
    )


def scrape(transport: Transport, url: str, timeout: float = 30.0) -> Samples:
    """One engine's /metrics; empty when it does not answer."""
    try:
        with httpx.Client(timeout=timeout, transport=transport.http()) as client:
            resp = client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return {}
    return parse_prometheus(resp.text) if resp.status_code == 200 else {}


class UsageMeter:
    """Each engine's usage over a span (a capacity point): scrape every engine at start() and at stop()."""

    def __init__(self, engines: Sequence[tuple[str, str, Transport]]) -> None:
        self.engines = list(engines)  # (name, url, transport)
        self._before: dict[str, Samples] = {}

    @classmethod
    def for_leg(cls, ep: Endpoints, hosts: Mapping[str, Transport], aggregated: bool = False) -> UsageMeter:
        decode = "aggregated" if aggregated else "decode"
        prefills = zip(ep.prefill_urls, [node for node, _ in ep.prefill_logs], strict=False)
        decodes = zip(ep.decode_urls, ep.decode_nodes, strict=False)
        engines = [(f"prefill-{i}", url, node) for i, (url, node) in enumerate(prefills)]
        engines += [(f"{decode}-{i}", url, node) for i, (url, node) in enumerate(decodes)]
        return cls([(name, url, hosts[node]) for name, url, node in engines if node in hosts])

    def start(self) -> None:
        self._before = {name: scrape(t, url) for name, url, t in self.engines}

    def stop(self, span_ms: float) -> tuple[EngineUsage, ...]:
        out = [usage_delta(name, self._before.get(name, {}), scrape(t, url), span_ms) for name, url, t in self.engines]
        return tuple(u for u in out if u is not None)
