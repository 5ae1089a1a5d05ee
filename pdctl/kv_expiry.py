"""How long a decode handle may be used: one rule shared by the topology check, the plan and the router.

vLLM's prefill declines a D->P read whose `remote_blocks_expiry_time` is within 5 s (`pull_scheduler`,
reference/vllm-bidirectional.md); the router stops using a handle earlier still, by that margin plus slack for
the request in flight and the clock offset between hosts. Deriving the router's margin from the engine's keeps
the two from disagreeing: a margin below the engine's made every handle a failed read at short TTLs.
"""

from __future__ import annotations

ENGINE_EXPIRY_MARGIN_S = 5.0
ROUTER_SLACK_S = 5.0
ROUTER_EXPIRY_MARGIN_S = ENGINE_EXPIRY_MARGIN_S + ROUTER_SLACK_S


def handle_lifetime(handle_ttl: float, decoder_kv_blocks_ttl: float, margin: float = ROUTER_EXPIRY_MARGIN_S) -> float:
    """Seconds a handle stays usable after the router received it; <= 0 means never."""
    return min(handle_ttl, decoder_kv_blocks_ttl - margin)
