"""Chat and completions through the router report `usage.prompt_tokens_details.cached_tokens` as vLLM does: the
prompt tokens the turn did not compute (the prefill's own prefix-cache hit plus what it read from the decode).
Real simulator processes with --enable-prompt-tokens-details, a real router, the official openai SDK as client;
streamed (stream_options.include_usage) and not. The truth they are compared with: X-PD-KV-Reuse `tokens` (a hit
through the prefill: read plus the prefill's own cache) and the prefill's own counters."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from pdctl.router.wire import Reuse
from tests.router.conftest import SPEED, RouterProc, corrupt, router_process
from tests.support.sim_procs import SimPair, sim_pair

DETAILS = ["--enable-prompt-tokens-details"]
HISTORY = " ".join(f"h{i}" for i in range(300))
HITS = "vllm:prefix_cache_hits_total"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimPair, RouterProc]]:
    d = tmp_path_factory.mktemp("cached-tokens")
    with (
        sim_pair(d, speed=SPEED, prefill_args=DETAILS, decode_args=DETAILS,
                 prefill_kwargs={"prefix_caching": True}) as pd,
        router_process(d, [pd.prefill_url], [pd.decode_url]) as router,
    ):
        yield pd, router


def _client(router: RouterProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]], cid: str, stream: bool) -> tuple[Any, str, Reuse]:
    """(usage, reply text, X-PD-KV-Reuse) of one chat turn."""
    extra = {"X-Conversation-ID": cid}
    if not stream:
        raw = client.chat.completions.with_raw_response.create(model="Qwen", messages=messages,  # type: ignore[arg-type]
                                                               max_tokens=12, extra_headers=extra)
        resp = raw.parse()
        return resp.usage, resp.choices[0].message.content or "", Reuse.parse(raw.headers.get("x-pd-kv-reuse"))
    with client.chat.completions.with_streaming_response.create(
            model="Qwen", messages=messages, max_tokens=12, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}, extra_headers=extra) as raw:
        reuse = Reuse.parse(raw.headers.get("x-pd-kv-reuse"))
        usage, text = None, []
        for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            text += [c.delta.content or "" for c in chunk.choices]
    return usage, "".join(text), reuse


def _completion(client: openai.OpenAI, prompt: str, cid: str, stream: bool) -> tuple[Any, str, Reuse]:
    extra = {"X-Conversation-ID": cid}
    if not stream:
        raw = client.completions.with_raw_response.create(model="Qwen", prompt=prompt, max_tokens=12,
                                                          extra_headers=extra)
        resp = raw.parse()
        return resp.usage, resp.choices[0].text, Reuse.parse(raw.headers.get("x-pd-kv-reuse"))
    with client.completions.with_streaming_response.create(
            model="Qwen", prompt=prompt, max_tokens=12, stream=True, stream_options={"include_usage": True},
            extra_headers=extra) as raw:
        reuse = Reuse.parse(raw.headers.get("x-pd-kv-reuse"))
        usage, text = None, []
        for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage
            text += [c.text for c in chunk.choices]
    return usage, "".join(text), reuse


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_reports_the_tokens_not_recomputed(deployment: tuple[SimPair, RouterProc], stream: bool) -> None:
    pd, router = deployment
    client, cid = _client(router), uuid.uuid4().hex
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"{uuid.uuid4().hex} {HISTORY}"}]
    usage, text, reuse = _chat(client, messages, cid, stream)
    assert reuse.outcome == "miss" and usage.prompt_tokens_details.cached_tokens == 0  # nothing cached yet
    for turn in range(2):
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then {turn}?"}]
        hits = pd.prefill.metric(HITS)
        usage, text, reuse = _chat(client, messages, cid, stream)
        cached = usage.prompt_tokens_details.cached_tokens
        assert reuse.outcome == "hit" and reuse.read is not None, reuse
        # Not recomputed: what the prefill's own cache held (its counter) plus what it read from the decode.
        assert cached == reuse.tokens == pd.prefill.metric(HITS) - hits + reuse.read, (reuse, cached)
        assert 300 < cached < usage.prompt_tokens
    assert corrupt(pd.prefill, pd.decode) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_report_the_tokens_not_recomputed(deployment: tuple[SimPair, RouterProc], stream: bool) -> None:
    pd, router = deployment
    client, cid = _client(router), uuid.uuid4().hex
    prompt = f"{uuid.uuid4().hex} {HISTORY}"
    usage, text, reuse = _completion(client, prompt, cid, stream)
    assert reuse.outcome == "miss" and usage.prompt_tokens_details.cached_tokens == 0
    prompt += text + " go on"
    hits = pd.prefill.metric(HITS)
    usage, _, reuse = _completion(client, prompt, cid, stream)
    cached = usage.prompt_tokens_details.cached_tokens
    assert reuse.outcome == "hit" and reuse.read is not None, reuse
    assert cached == reuse.tokens == pd.prefill.metric(HITS) - hits + reuse.read, (reuse, cached)
    assert 300 < cached < usage.prompt_tokens
    assert corrupt(pd.prefill, pd.decode) == 0


def test_engines_without_token_details_still_get_the_reused_tokens(tmp_path: Path) -> None:
    """Engines that report no prompt_tokens_details (vLLM without the flag): the router reports what it reused."""
    with (
        sim_pair(tmp_path, speed=SPEED) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url]) as router,
    ):
        client, cid = _client(router), uuid.uuid4().hex
        messages: list[dict[str, Any]] = [{"role": "user", "content": HISTORY}]
        usage, text, _ = _chat(client, messages, cid, False)
        assert usage.prompt_tokens_details.cached_tokens == 0
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "next"}]
        for stream in (False, True):
            usage, text, reuse = _chat(client, messages, cid, stream)
            assert reuse.outcome == "hit" and reuse.read == reuse.tokens > 300  # no prefill cache: all read
            assert usage.prompt_tokens_details.cached_tokens == reuse.tokens
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
