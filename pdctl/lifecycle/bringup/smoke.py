"""The smoke test `up` ends with: a two-turn conversation through the router; turn 2 must reuse decode's KV.

The router says what happened in the `X-PD-KV-Reuse: hit|partial|miss;tokens=N;reason=...` header. With
`connector.bidirectional_kv_xfer` on, anything but `hit` on turn 2 fails `up` with the likely causes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from pdctl.errors import SmokeTestError
from pdctl.remote.base import Transport
from pdctl.router import wire
from pdctl.router.wire import Reuse, RouterStats
from pdctl.secret import bearer
from pdctl.topology import Topology

# Long enough that turn 2's history is well over kv_recompute_threshold and router.min_read_tokens (256) tokens on
# any tokenizer (540+): on a topology of several prefills turn 2 may land on one that never saw turn 1, and must
# then read the history from the decode rather than recompute it as too short to be worth a read (issue 29).
_WORDS = ["amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
          "kestrel", "lumen", "marble", "nectar", "onyx", "prairie", "quartz", "raven", "saffron", "tundra"]
FIRST = (
    "We are testing a disaggregated serving deployment. "
    + " ".join(f"Item {i} of the list is the word {w}." for i, w in enumerate(_WORDS * 3))
    + " Repeat the first three words."
)
SECOND = "Now name the last word of the list."


@dataclass(frozen=True)
class SmokeResult:
    conversation_id: str
    turn1: Reuse
    turn2: Reuse
    required_hit: bool

    def to_json(self) -> dict[str, Any]:
        """As the state file has always held it (a turn's outcome under `kind`)."""
        turns = {f"turn{n}": {"kind": t.outcome, "tokens": t.tokens, "reason": t.reason}
                 for n, t in ((1, self.turn1), (2, self.turn2))}
        return {"conversation_id": self.conversation_id, **turns, "required_hit": self.required_hit}


def smoke_test(topo: Topology, router_url: str, transport: Transport, timeout: float = 120.0) -> SmokeResult:
    """Run the two turns through `transport` (the router's host); raise SmokeTestError when turn 2 is not a hit
    and bidirectional transfer is on."""
    cid = f"pdctl-smoke-{uuid.uuid4().hex[:12]}"
    headers = bearer(router_api_key(topo))
    messages: list[dict[str, str]] = [{"role": "user", "content": FIRST}]
    with httpx.Client(base_url=router_url, timeout=timeout, headers=headers, transport=transport.http()) as client:
        reply, turn1 = _turn(client, topo, cid, messages, 1)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": SECOND}]
        _, turn2 = _turn(client, topo, cid, messages, 2)
        stats = _stats(client)
    required = topo.mode != "aggregated" and any(topo.connector_for(d).bidirectional_kv_xfer for d in topo.decode)
    result = SmokeResult(cid, turn1, turn2, required)
    if required and turn2.outcome != "hit":
        raise SmokeTestError(_diagnose(topo, result, stats), hint=_HINT)
    return result


def _turn(
    client: httpx.Client, topo: Topology, cid: str, messages: list[dict[str, str]], n: int
) -> tuple[str, Reuse]:
    # Streamed, as agents and the bench use it: vLLM < 0.33 returns the decode's handle only in whole responses.
    body = {
        "model": topo.model.name,
        "messages": messages,
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "conversation_id": cid,
    }
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            raw = resp.read()
    except httpx.HTTPError as exc:
        raise SmokeTestError(
            f"smoke test turn {n}: the router at {client.base_url} did not answer: {type(exc).__name__}: {exc}",
            hint="read the router's log: `pdctl logs router`",
        ) from None
    text = raw.decode("utf-8", errors="replace")
    if resp.status_code != 200:
        raise SmokeTestError(
            f"smoke test turn {n}: the router answered HTTP {resp.status_code}: {text[:500]}",
            hint="read the logs: `pdctl logs router`, `pdctl logs prefill-0`, `pdctl logs decode-0`",
        )
    reply = _streamed_content(text)
    if reply is None:
        raise SmokeTestError(
            f"smoke test turn {n}: not a chat completion stream: {text[:300]}",
            hint="is the router's upstream a vLLM-compatible server? `pdctl logs router`",
        )
    return reply, Reuse.parse(resp.headers.get(wire.REUSE_HEADER))


def _streamed_content(text: str) -> str | None:
    """The assistant's text from an SSE chat stream; None when it is no such stream or ends in an error event."""
    parts: list[str] = []
    chunks = 0
    for line in text.splitlines():
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            return None
        if not isinstance(event, dict) or "error" in event:  # the router ends a failed stream with an error event
            return None
        chunks += 1
        for choice in event.get("choices") or []:
            parts.append(((choice or {}).get("delta") or {}).get("content") or "")
    return "".join(parts) if chunks else None


def _stats(client: httpx.Client) -> RouterStats | None:
    try:
        return RouterStats.from_json(client.get("/stats").json())
    except (httpx.HTTPError, ValueError):
        return None


def _diagnose(topo: Topology, result: SmokeResult, stats: RouterStats | None) -> str:
    t2 = result.turn2
    lines = [
        f"smoke test: turn 2 of conversation {result.conversation_id} was `{t2.outcome}`"
        f"{f' ({t2.reason})' if t2.reason else ''}, not a reuse hit, although "
        "connector.bidirectional_kv_xfer is on.",
        "Likely causes:",
    ]
    flags = {(topo.connector_for(i).bidirectional_kv_xfer, topo.connector_for(i).decoder_kv_blocks_ttl)
             for _, _, i in topo.instances()}
    if len(flags) > 1:
        lines.append("  * the KV-transfer flags differ between prefill and decode (bidirectional_kv_xfer / ttl)")
    else:
        lines.append("  * the KV-transfer flags differ between prefill and decode (check `pdctl plan`)")
    lines += [
        "  * decode returns no kv_transfer_params in streaming responses (vLLM older than 0.33.0 "
        "without pdctl's compatibility patch)",
        "  * the decode's NIXL side channel is unreachable from prefill (firewall, wrong "
        "VLLM_NIXL_SIDE_CHANNEL_HOST); `pdctl status` shows NIXL failures",
    ]
    specific = next((text for key, text in _BY_REASON.items() if key in t2.reason), None)
    if specific:
        lines.insert(1, f"Most likely: {specific}.")
    if stats is not None and stats.reuse_reasons:
        lines.append(f"router reuse reasons so far: {dict(stats.reuse_reasons)}")
    return "\n".join(lines)


# The router's miss reasons (X-PD-KV-Reuse reason=...) -> what usually causes them.
_BY_REASON = {
    wire.NO_HANDLE_RETURNED: "decode returned no kv_transfer_params at the end of its stream (vLLM < 0.33.0 "
    "without pdctl's compatibility patch, or bidirectional_kv_xfer off on decode)",
    wire.EXPIRED: "decode's handle expired before turn 2 (router.handle_ttl or connector.decoder_kv_blocks_ttl "
    "too short for this deployment)",
    wire.PREVIOUS_TURN_FAILED: "turn 1's KV transfer failed (NIXL side channel unreachable, or backend "
    "misconfigured); see `pdctl status` NIXL failures and the engine logs",
    wire.PREFIX_DIVERGED: "turn 2's prompt did not extend turn 1's tokens (chat template or tokenizer differs "
    "between router and engines)",
    wire.NEW_CONVERSATION: "the router did not tie the two turns together (conversation_id not honoured)",
    wire.READ_NOT_WORTH: "turn 2's history was shorter than router.min_read_tokens and its prefill had none of it "
    "cached, so it recomputed it (a tokenizer that makes far fewer tokens than the smoke text's 540+, or a "
    "min_read_tokens above it)",
}

_HINT = "the deployment is left running to inspect: `pdctl status`, `pdctl logs decode-0`; `pdctl down` stops it"


def router_api_key(topo: Topology) -> str | None:
    """The key the router will require: the topology's env.router (over env.all) sets it in the router's
    environment; else a router on this machine inherits pdctl's own. None: no key, or none the router would get."""
    import os

    name = topo.router.api_key_env
    if not name:
        return None
    env = {**topo.env.all, **topo.env.router}
    if name in env:
        return env[name] or None
    if topo.node(topo.router.node).transport == "local":
        return os.environ.get(name) or None
    return None
