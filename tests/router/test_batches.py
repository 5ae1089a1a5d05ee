"""A list of prompts in /v1/completions (one P/D flow per prompt) and n > 1 (a decode alone, no reuse)."""

from __future__ import annotations

import json
import uuid

import httpx

from tests.router.agents import assert_openai_error
from tests.router.conftest import RouterProc, assert_clean, corrupt
from tests.support.sim_procs import SERVED, SimPair


def _prompts() -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"batch {tag} first w31 w32 " * 6, f"batch {tag} second w41 w42 " * 6]


def _single(router: RouterProc, prompt: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(router.url + "/v1/completions", json={"model": SERVED, "prompt": prompt,
                                                             "max_tokens": max_tokens}, timeout=30)


def test_a_batch_is_one_flow_per_prompt_reassembled_in_order(router: RouterProc, pd: SimPair) -> None:
    prompts = _prompts()
    r = httpx.post(router.url + "/v1/completions", json={"model": SERVED, "prompt": prompts, "max_tokens": 4},
                   timeout=30)
    assert r.status_code == 200
    assert_clean(r.content, r.headers)
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert r.headers["x-pd-kv-reuse"] == "miss;tokens=0;reason=new_conversation, miss;tokens=0;reason=new_conversation"
    assert body["usage"]["completion_tokens"] == 8
    # Each prompt kept its own handle: continuing either one reads its KV.
    for prompt, choice in zip(prompts, body["choices"], strict=True):
        follow = _single(router, prompt + choice["text"] + " then w51")
        assert follow.headers["x-pd-kv-reuse"].startswith("hit;"), follow.headers["x-pd-kv-reuse"]
    assert corrupt(pd.prefill, pd.decode) == 0


def test_a_streamed_batch_is_one_stream_with_each_prompts_index(router: RouterProc, pd: SimPair) -> None:
    prompts = _prompts()
    body = {"model": SERVED, "prompt": prompts, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=30) as r:
        raw = r.read()
    assert r.status_code == 200
    assert_clean(raw, r.headers)
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    texts = ["", ""]
    for e in events[:-1]:
        for c in json.loads(e)["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == [_single(router, p, 3).json()["choices"][0]["text"] for p in prompts]  # the engine is deterministic
    assert corrupt(pd.prefill, pd.decode) == 0


def test_bad_batches_are_400(router: RouterProc) -> None:
    r = httpx.post(router.url + "/v1/completions", json={"model": SERVED, "prompt": ["ok", 5]}, timeout=10)
    assert_openai_error(r, 400, "`prompt` must be a string, a list of token ids, or a list of non-empty strings or "
                        "token-id lists")
    r = httpx.post(router.url + "/v1/completions", json={"model": SERVED, "prompt": ["w1"] * 300}, timeout=10)
    assert_openai_error(r, 400, "a batch of 300 prompts is over the router's limit of 256; split it into several "
                        "requests")
    assert httpx.get(router.url + "/health", timeout=5).status_code == 200


def test_n_samples_run_on_a_decode_alone_and_keep_no_handle(router: RouterProc, pd: SimPair) -> None:
    messages = [{"role": "user", "content": "several answers w61 " * 5}]
    before = router.stats()
    r = httpx.post(router.url + "/v1/chat/completions", json={"model": SERVED, "messages": messages, "n": 3,
                                                               "max_tokens": 4}, timeout=30)
    after = router.stats()
    assert r.status_code == 200
    assert_clean(r.content, r.headers)
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) == 3
    assert r.headers["x-pd-kv-reuse"] == "miss;tokens=0;reason=n_gt_1" and r.headers["x-pd-prefill-ms"] == "0.0"
    assert after["reuse_reasons"].get("n_gt_1", 0) == before["reuse_reasons"].get("n_gt_1", 0) + 1
    assert after["live_handles"] == before["live_handles"]
    assert after["eligible_turns"] == before["eligible_turns"]
    # The next turn continues from choice 0 but has no handle to read: a plain new conversation.
    follow = [*messages, {"role": "assistant", "content": choices[0]["message"]["content"]},
              {"role": "user", "content": "more"}]
    r2 = httpx.post(router.url + "/v1/chat/completions", json={"model": SERVED, "messages": follow, "max_tokens": 2},
                    timeout=30)
    assert r2.headers["x-pd-kv-reuse"] == "miss;tokens=0;reason=new_conversation"
    assert corrupt(pd.prefill, pd.decode) == 0


def test_streamed_n_samples(router: RouterProc) -> None:
    body = {"model": SERVED, "prompt": "streamed samples w71 " * 4, "n": 2, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", router.url + "/v1/completions", json=body, timeout=30) as r:
        raw = r.read()
    assert r.status_code == 200 and r.headers["x-pd-kv-reuse"] == "miss;tokens=0;reason=n_gt_1"
    assert_clean(raw, r.headers)
    indexes = {c["index"] for line in raw.decode().split("\n") if line.startswith("data: {")
               for c in json.loads(line[6:])["choices"]}
    assert indexes == {0, 1}
