"""How long a decode handle may be used: one rule shared by the topology check, the plan and the router.

vLLM's prefill declines a D->P read whose `remote_blocks_expiry_time` is within 5 s (`pull_scheduler`,
reference/vllm-bidirectional.md); the router stops using a handle earlier still, by that margin plus slack for
the request in flight and the clock offset between hosts. Deriving the router's margin from the engine's keeps
the two from disagreeing: a margin below the engine's made every handle a failed read at short TTLs.
"""

from __future__ import annotations

from collections.abc import Sequence

ENGINE_EXPIRY_MARGIN_S = 5.0
ROUTER_SLACK_S = 5.0
ROUTER_EXPIRY_MARGIN_S = ENGINE_EXPIRY_MARGIN_S + ROUTER_SLACK_S


def handle_lifetime(handle_ttl: float, decoder_kv_blocks_ttl: float, margin: float = ROUTER_EXPIRY_MARGIN_S) -> float:
    """Seconds a handle stays usable after the router received it; <= 0 means never."""
    return min(handle_ttl, decoder_kv_blocks_ttl - margin)


def leaves_no_handle(decoder_kv_blocks_ttl: float, margin: float = ROUTER_EXPIRY_MARGIN_S) -> bool:
    """The decode frees a turn's blocks before the router's margin ends: no handle would ever be usable.

    The minimum decode TTL is therefore the margin itself; the topology check and the router both refuse below it.
    """
    return decoder_kv_blocks_ttl - margin <= 0


def shortest_ttl(decoder_kv_blocks_ttls: Sequence[int]) -> tuple[int, int]:
    """(index, TTL) of the decode that frees a finished turn's blocks first: the TTL the router must plan for."""
    ttl, index = min((ttl, i) for i, ttl in enumerate(decoder_kv_blocks_ttls))
    return index, ttl
