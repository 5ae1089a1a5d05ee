"""Conditional disaggregation counts a turn's new tokens from the conversation's own tokens per byte, learned from
the decode's token ids (issue 29, item 2), not from a byte bound: a 512-token user turn of 4-5 KB runs on its
decode alone under the default --local-prefill-tokens 4096. A wrong estimate costs time, never correctness."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from pdctl.router.server.routes import ROUTES
from pdctl.router.turn import history as hist
from pdctl.router.turn.capture import Capture
from pdctl.router.turn.context import RequestContext
from pdctl.sim.tokenizer import encode, render_chat
from tests.router.conftest import SPEED, corrupt, router_process
from tests.router.talk import Conversation
from tests.support.sim_procs import SERVED, sim_pair


def _words(n: int, salt: str) -> str:
    """n words of 9-10 bytes each (with their space): one simulator token each, as long as vLLM's benchmark's."""
    return " ".join(f"{salt}{i:05d}xyz" for i in range(n))


def _ctx(body: dict[str, Any]) -> RequestContext:
    path = "/v1/chat/completions"
    return RequestContext("rid", 0.0, "POST", path, [], b"", ROUTES.match(path), body)


def _replied(prompt_ids: list[int], text: str) -> Capture:
    capture = Capture(True, False)
    out = encode(text)
    capture.take({"prompt_token_ids": prompt_ids,
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "token_ids": out}]},
                 whole=True)
    return capture


def test_the_learned_ratio_counts_a_512_token_turn_as_about_512_and_never_below_it() -> None:
    old = [{"role": "system", "content": "be brief"}, {"role": "user", "content": _words(3000, "a")}]
    reply = _words(80, "r")
    h = hist.history(_ctx({"model": SERVED, "messages": old}), _replied(render_chat(old), reply))
    assert h is not None and h.tokens > 3000 and h.nbytes > 27000
    history = [*old, {"role": "assistant", "content": reply}]
    new = [{"role": "user", "content": _words(512, "u")}]
    estimate = hist.added_tokens(_ctx({"model": SERVED, "messages": [*history, *new]}), h)
    held = render_chat(old) + encode(reply)
    missing = len(render_chat([*history, *new])) - len(held)
    assert estimate is not None and missing <= estimate <= 1024 < 4096 < len(new[0]["content"].encode())
    # Without token ids (an engine that sent none) the byte bound stays: over 4096 for the same turn.
    no_ids = Capture(True, False)
    no_ids.take({"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}, whole=True)
    blind = hist.history(_ctx({"model": SERVED, "messages": old}), no_ids)
    assert blind is not None and blind.tokens == 0
    assert (hist.added_tokens(_ctx({"model": SERVED, "messages": [*history, *new]}), blind) or 0) > 4096


def test_a_512_token_user_turn_runs_on_its_decode_under_the_default_limit(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED, prefill_kwargs={"prefix_caching": True}) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "4096") as router,
    ):
        conv = Conversation(router.url, True, True, "body", uuid.uuid4().hex, max_tokens=16)
        assert conv.turn(_words(2000, uuid.uuid4().hex[:4])).status == 200
        prompts = pd.prefill.metric("vllm:prompt_tokens_total")
        for turn in range(2):
            user = _words(512, f"t{turn}")
            assert len(user.encode()) > 4096  # the byte bound alone would send it through the prefill
            reply = conv.turn(user)
            assert reply.status == 200 and (reply.outcome, reply.reason) == ("hit", "decode_local"), reply.reuse
        assert pd.prefill.metric("vllm:prompt_tokens_total") == prompts  # the prefill never saw them
        assert corrupt(pd.prefill, pd.decode) == 0
