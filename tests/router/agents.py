"""What the agent-API tests share: the tool they offer, the checks they make on every answer."""

from __future__ import annotations

from typing import Any

import httpx

from tests.router.conftest import RouterProc, corrupt
from tests.support.sim_procs import SimPair

PARAMS = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a thing up.",
                                               "parameters": PARAMS}}]
RESPONSES_TOOLS = [{"type": "function", "name": "lookup", "description": "Look a thing up.", "parameters": PARAMS}]
ANTHROPIC_TOOLS = [{"name": "lookup", "description": "Look a thing up.", "input_schema": PARAMS}]
FIRST = "find the report on w11 w12 w13 " * 6


def outcome(headers: httpx.Headers | Any) -> str:
    return str(headers.get("x-pd-kv-reuse", "")).split(";")[0]


def assert_loop_reused(outcomes: list[str], router: RouterProc, pd: SimPair, hits_before: int,
                       auth: dict[str, str] | None = None) -> None:
    """Turn 1 is a new conversation, every later turn reads the previous turn's KV; the oracle stays 0."""
    assert outcomes[0] == "miss"
    assert outcomes[1:] == ["hit"] * (len(outcomes) - 1)
    assert router.stats(**(auth or {}))["reuse"]["hit"] - hits_before >= len(outcomes) - 1
    assert corrupt(pd.prefill, pd.decode) == 0


def assert_openai_error(r: httpx.Response, status: int, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {"error": {"message": message, "type": r.json()["error"]["type"], "code": status}}


def assert_anthropic_error(r: httpx.Response, status: int, kind: str, message: str) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {"type": "error", "error": {"type": kind, "message": message}}
