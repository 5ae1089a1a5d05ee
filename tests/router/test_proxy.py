"""pipeline.completion's turn bookkeeping as an agent loop sees it: the next turn is sent the instant the last ended.

The router must have stored a turn's new handle (and released the one it took) before its client can see the
turn's end, whenever the decode's stream itself closes: behind the `late` router (conftest.py) the decode's
streams close 150 ms after their `[DONE]` (a busy engine), which is when the router used to do that bookkeeping.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.router.conftest import BLOCK, RouterProc, corrupt, router_process
from tests.router.instant import Instant, reuse_header, sse_data
from tests.support.sim_procs import SERVED, SimPair, sim_pair

TURNS = 8


def _text(chat: bool, stream: bool, raw: bytes) -> str:
    if not stream:
        choice = json.loads(raw)["choices"][0]
        return str(choice["message"]["content"] if chat else choice["text"])
    parts = []
    for e in sse_data(raw):
        for c in e.get("choices") or ():
            parts.append(((c.get("delta") or {}).get("content") or "") if chat else (c.get("text") or ""))
    return "".join(parts)


def _loop(url: str, chat: bool, stream: bool, headers: dict[str, str] | None) -> list[str]:
    """An agent loop of TURNS turns; each turn's X-PD-KV-Reuse."""
    client = Instant(url)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    messages: list[dict[str, Any]] = []
    prompt = f"an agent {uuid.uuid4().hex} starts its task " * 4
    reuse = []
    try:
        for turn in range(TURNS):
            user = f" the tool said w{turn} w{turn + 1}"
            body: dict[str, Any] = {"model": SERVED, "max_tokens": 6, "stream": stream}
            if chat:
                body["messages"] = [*messages, {"role": "user", "content": prompt + user}]
            else:
                body["prompt"] = prompt + user
            got, raw = client.post(path, body, b"data: [DONE]", headers)
            reuse.append(reuse_header(got))
            text = _text(chat, stream, raw)
            if chat:
                messages, prompt = [*body["messages"], {"role": "assistant", "content": text}], ""
            else:
                prompt = body["prompt"] + text
    finally:
        client.close()
    return reuse


@pytest.mark.parametrize("mode", ["header", "derived"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [True, False])
def test_a_turn_sent_the_instant_the_last_one_ended_reuses_its_kv(
    late: RouterProc, pd: SimPair, chat: bool, stream: bool, mode: str,
) -> None:
    headers = {"X-Session-ID": uuid.uuid4().hex} if mode == "header" else None
    reuse = _loop(late.url, chat, stream, headers)
    assert reuse[0].startswith("miss;")
    assert [r.split(";")[0] for r in reuse[1:]] == ["hit"] * (TURNS - 1), reuse
    assert corrupt(pd.prefill, pd.decode) == 0


def test_two_turns_of_one_conversation_at_once_still_miss_as_handle_in_use(tmp_path: Path) -> None:
    # Slow engines, so that the second request certainly arrives while the first still decodes.
    with sim_pair(tmp_path, speed=5, block_size=BLOCK) as pd, router_process(tmp_path, [pd.prefill_url],
                                                                             [pd.decode_url]) as router:
        headers = {"X-Session-ID": uuid.uuid4().hex}
        first: dict[str, Any] = {"model": SERVED, "prompt": "a first turn of some length " * 6, "max_tokens": 4}
        with httpx.Client(timeout=60) as c:
            r = c.post(router.url + "/v1/completions", json=first, headers=headers)
            body = {**first, "prompt": first["prompt"] + r.json()["choices"][0]["text"] + " and then"}
            with c.stream("POST", router.url + "/v1/completions", json={**body, "stream": True, "max_tokens": 200},
                          headers=headers) as s:
                assert s.headers["x-pd-kv-reuse"].startswith("hit;")
                second = c.post(router.url + "/v1/completions", json=body, headers=headers)
                s.read()
    assert second.status_code == 200
    assert second.headers["x-pd-kv-reuse"] == "miss;tokens=0;reason=handle_in_use"
