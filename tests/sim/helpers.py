"""Drive a simulated P/D pair by hand: the router's two hops, without the router."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.support.sim_procs import SERVED

MISS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
        "remote_host": None, "remote_port": None}


def as_hit(d_handle: dict[str, Any]) -> dict[str, Any]:
    """D's handle as the router sends it back to P (section 3.5)."""
    return {**d_handle, "do_remote_decode": True, "do_remote_prefill": False}


def prefill(url: str, body: dict[str, Any], kv: dict[str, Any] | None = None, chat: bool = False) -> httpx.Response:
    payload = {**body, "model": SERVED, "max_tokens": 1, "stream": False, "kv_transfer_params": kv or MISS}
    return httpx.post(f"{url}/v1/{'chat/completions' if chat else 'completions'}", json=payload, timeout=30)


def decode_stream(url: str, body: dict[str, Any], kv: dict[str, Any], max_tokens: int = 8,
                  chat: bool = False) -> list[dict[str, Any]]:
    """The decode hop, streaming with return_token_ids; returns the parsed chunks (without [DONE])."""
    payload = {**body, "model": SERVED, "max_tokens": max_tokens, "stream": True, "return_token_ids": True,
               "ignore_eos": True, "kv_transfer_params": kv}
    chunks = []
    with httpx.stream("POST", f"{url}/v1/{'chat/completions' if chat else 'completions'}", json=payload,
                      timeout=30) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunks.append(json.loads(line[len("data: "):]))
    return chunks


def final_handle(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert len(final) == 1
    return final[0]["kv_transfer_params"]


def output_ids(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for c in chunks if c["choices"] for t in (c["choices"][0].get("token_ids") or [])]


def text_of(chunks: list[dict[str, Any]], chat: bool) -> str:
    if chat:
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def two_hop(pair: Any, body: dict[str, Any], d_handle: dict[str, Any] | None = None, max_tokens: int = 8,
            chat: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P with max_tokens=1 (a miss, or D's previous handle), then D streaming with P's params."""
    p = prefill(pair.prefill_url, body, as_hit(d_handle) if d_handle else None, chat=chat)
    assert p.status_code == 200, p.text
    chunks = decode_stream(pair.decode_url, body, p.json()["kv_transfer_params"], max_tokens, chat=chat)
    return chunks, final_handle(chunks)


def wait_until(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll a condition that a background task makes true; a generous deadline, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()
