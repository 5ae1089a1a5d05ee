"""The eviction profile (`pdctl bench --profile evict`): agent sessions whose histories exceed what the prefills'
KV holds, so the prefills' prefix caches evict them and bidirectional transfer has something to win.

The workload is the agent profile's shape (pdctl.bench.traffic.agent: a shared system prompt, tool results, think times,
open-loop arrivals) with the eviction case's defaults (`EVICT_AGENT`: think 2-8 s, 6 turns). The sessions are
sized, not the engines: once the first P/D leg is deployed, each prefill's KV capacity is read from its /metrics
(`vllm:cache_config_info`: num_gpu_blocks x block_size, which vLLM and the simulator both report) and the session
count from which the histories exceed it is computed (`EvictionSize`); a search starts there, and sweep points below
it are marked as not evicting. Shrink the prefills' KV (`--set extra_args.prefill=[--num-gpu-blocks-override,N]`)
to evict with fewer sessions.

The default legs (`legs`): off (bidirectional off, the prefills' prefix caching on: the honest baseline),
on-prefill (every warm turn through a prefill, which reads from the decode what its cache lacks), on (defaults),
and agg (aggregated engines on the same GPUs: one per GPU set the P/D instances use, on their nodes and ports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from pdctl.bench.leg.legs import Endpoints, LegSpec
from pdctl.bench.runner.collect import scrape_text
from pdctl.bench.traffic.agent import AgentSpec, Range
from pdctl.engine_metrics import kv_capacity_tokens
from pdctl.remote.base import Transport
from pdctl.topology import Topology

EVICT_AGENT = AgentSpec(sessions=1, turns=6, system_tokens=6000, tool_tokens=Range(200, 2000), output_tokens=200,
                        think_s=Range(2.0, 8.0), arrival_rate=2.0)
"""The eviction case's agent sessions (flags override each value); `pdctl demo --eviction` and
scripts/capacity_sweep.py --profile eviction play the same shape."""
EVICT_SLO = "ttft_p90=500,itl_p99=200"
CACHING_ON = "prefill[*].prefix_caching=true"


def legs(topo: Topology) -> list[LegSpec]:
    """off, on-prefill, on and agg for `topo` (its own settings plus these overrides)."""
    return [
        LegSpec("off", ("connector.bidirectional_kv_xfer=false", CACHING_ON)),
        LegSpec("on-prefill", ("connector.bidirectional_kv_xfer=true", "router.local_prefill_tokens=0", CACHING_ON)),
        LegSpec("on", ("connector.bidirectional_kv_xfer=true", CACHING_ON)),
        aggregated_leg(topo),
    ]


def aggregated_leg(topo: Topology, name: str = "agg") -> LegSpec:
    """Aggregated engines on the GPUs the P/D instances use: one engine per distinct (node, GPU set), on the first
    such instance's port; instances without GPU ids (the simulator) are one engine each. Where several instances
    shared a GPU set, the engine gets their memory fractions together (capped at 0.95)."""
    groups: dict[tuple[str, tuple[int, ...]] | int, list[Any]] = {}
    for i, inst in enumerate([*topo.prefill, *topo.decode]):
        key: tuple[str, tuple[int, ...]] | int = (inst.node, tuple(inst.gpus)) if inst.gpus else i
        groups.setdefault(key, []).append(inst)
    engines = []
    for members in groups.values():
        first = members[0]
        entry: dict[str, Any] = {"node": first.node, "port": first.port, "side_channel_port": first.side_channel_port}
        if first.gpus:
            entry |= {"gpus": list(first.gpus), "tp": first.tp}
        engines.append(entry)
    flow = yaml.safe_dump(engines, default_flow_style=True, width=10_000).strip()
    overrides = ["mode=aggregated", f"decode={flow}"]
    shared, util = max(len(m) for m in groups.values()), topo.model.gpu_memory_utilization
    if shared > 1 and topo.engine != "sim" and util is not None:
        overrides.append(f"model.gpu_memory_utilization={min(0.95, shared * util):g}")
    return LegSpec(name, tuple(overrides))


@dataclass(frozen=True)
class EvictionSize:
    """What the profile computed: each prefill's KV in tokens, a session's tokens at its last turn (the shared
    prefix once per prefill, its own part per session), and the fewest sessions whose histories exceed the prefills'
    KV together (0: the capacity is unknown)."""

    prefill_kv_tokens: tuple[int, ...]
    shared_tokens: int
    session_tokens: int
    evict_from: int

    def evicts(self, sessions: int) -> bool | None:
        return None if not self.evict_from else sessions >= self.evict_from

    def describe(self) -> str:
        if not self.evict_from:
            return "the prefills' KV capacity is unknown (no vllm:cache_config_info in their /metrics)"
        kv = " + ".join(f"{t:,}" for t in self.prefill_kv_tokens)
        return (f"prefill KV {kv} tokens; a session's history at its last turn {self.shared_tokens:,} shared + "
                f"{self.session_tokens:,} of its own tokens; histories exceed the prefills' KV from "
                f"{self.evict_from} sessions")

    def to_json(self) -> dict[str, Any]:
        return {"prefill_kv_tokens": list(self.prefill_kv_tokens), "shared_tokens": self.shared_tokens,
                "session_tokens": self.session_tokens, "evict_from": self.evict_from}


def own_tokens(agent: AgentSpec) -> int:
    """A session's own tokens at its last turn, on average: its task, then a reply and a tool result per turn."""
    tool = (agent.tool_tokens.low + agent.tool_tokens.high) / 2
    return math.ceil(agent.task_tokens + (agent.turns - 1) * (agent.output_tokens + tool))


def size(prefill_kv: Sequence[int | None], agent: AgentSpec) -> EvictionSize:
    """The fewest sessions whose histories (the shared prefix on every prefill, each session's own part once)
    exceed the prefills' KV together; 0 when any prefill's capacity is unknown."""
    own = own_tokens(agent)
    known = [k for k in prefill_kv if k is not None]
    if not known or len(known) != len(prefill_kv):
        return EvictionSize(tuple(known), agent.system_tokens, own, 0)
    room = sum(known) - len(known) * agent.system_tokens
    return EvictionSize(tuple(known), agent.system_tokens, own, max(1, math.floor(max(room, 0) / own) + 1))


def prefill_capacity(ep: Endpoints, hosts: Mapping[str, Transport]) -> list[int | None]:
    """Each prefill's KV capacity in tokens from its /metrics; None where it does not say."""
    out: list[int | None] = []
    for url, (node, _) in zip(ep.prefill_urls, ep.prefill_logs, strict=False):
        transport = hosts.get(node)
        text = scrape_text(transport, url) if transport is not None else ""
        out.append(kv_capacity_tokens(text) if text else None)
    return out
