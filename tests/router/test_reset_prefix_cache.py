"""`POST /reset_prefix_cache` through the router (AIPerf's --reset-kv-cache): every engine's prefix cache is
reset, the router's handles are dropped and released on the decodes, the next turn misses, the simulator's
integrity oracle stays 0; an admin route, refused without the API key. Real simulator processes and router."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import openai

from pdctl.router.wire import Reuse
from tests.router.conftest import SPEED, corrupt, router_process
from tests.support.sim_procs import sim_pair

KEY = "sk-h42-reset"
HISTORY = " ".join(f"r{i}" for i in range(300))
HITS = "vllm:prefix_cache_hits_total"


def test_reset_resets_engines_releases_handles_and_the_next_turn_misses(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=SPEED, prefill_kwargs={"prefix_caching": True}) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--api-key-env", "H42_KEY",
                       env={"H42_KEY": KEY}) as router,
    ):
        client = openai.OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=0)
        auth = {"Authorization": f"Bearer {KEY}"}
        cid = uuid.uuid4().hex
        messages: list[dict[str, Any]] = [{"role": "user", "content": HISTORY}]
        reply = client.chat.completions.create(model="Qwen", messages=messages, max_tokens=8,  # type: ignore[arg-type]
                                               extra_headers={"X-Conversation-ID": cid})
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "next"}]
        assert router.stats(**auth)["live_handles"] == 1

        # Without the key: refused as every admin route is, and nothing is touched.
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx.post(f"{router.url}/reset_prefix_cache", headers=headers, timeout=10)
            assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
        assert router.stats(**auth)["live_handles"] == 1

        # As AIPerf sends it: an empty body typed application/octet-stream.
        resp = httpx.post(f"{router.url}/reset_prefix_cache", content=b"", timeout=30,
                          headers={**auth, "content-type": "application/octet-stream"})
        assert resp.status_code == 200, resp.text
        doc = resp.json()
        assert doc["status"] == "ok" and doc["handles_released"] == 1 and doc["releases_pending"] == 0
        assert sorted((e["role"], e["url"], e["status"]) for e in doc["engines"]) == sorted(
            [("prefill", pd.prefill_url, 200), ("decode", pd.decode_url, 200)])
        stats = router.stats(**auth)
        assert stats["live_handles"] == 0 and stats["releases"].get("reset") == 1

        # The next turn misses (its handle was released), and the prefill's cache no longer holds the history.
        hits = pd.prefill.metric(HITS)
        raw = client.chat.completions.with_raw_response.create(model="Qwen", messages=messages,  # type: ignore[arg-type]
                                                               max_tokens=8, extra_headers={"X-Conversation-ID": cid})
        assert raw.status_code == 200
        reuse = Reuse.parse(raw.headers.get("x-pd-kv-reuse"))
        assert (reuse.outcome, reuse.reason, reuse.source) == ("miss", "released", "recomputed"), reuse
        assert raw.parse().usage.prompt_tokens_details.cached_tokens == 0
        assert pd.prefill.metric(HITS) == hits
        assert corrupt(pd.prefill, pd.decode) == 0


def test_an_engine_that_refuses_the_reset_is_named(tmp_path: Path) -> None:
    """A vLLM without VLLM_SERVER_DEV_MODE answers 404 on the route: the router says which engine and why (502)."""
    with (
        sim_pair(tmp_path, speed=SPEED) as pd,
        router_process(tmp_path, [pd.prefill_url, "http://127.0.0.1:9"], [pd.decode_url]) as router,
    ):
        resp = httpx.post(f"{router.url}/reset_prefix_cache", timeout=60)
        assert resp.status_code == 502
        doc = resp.json()
        assert "VLLM_SERVER_DEV_MODE=1" in doc["error"]["message"] and "http://127.0.0.1:9" in doc["error"]["message"]
        assert [e["status"] for e in doc["engines"] if e["url"] == pd.decode_url] == [200]
