"""Stateless engine routes through the router: answered as the engine answers, under the router's rules."""

from __future__ import annotations

import httpx

from tests.router.agents import assert_openai_error
from tests.router.conftest import AGENT_KEY, RouterProc, corrupt
from tests.support.sim_procs import SERVED, SimPair


def test_tokenize_and_detokenize_answer_as_the_engine(router: RouterProc, pd: SimPair) -> None:
    for path, body in (("/tokenize", {"model": SERVED, "prompt": "w1 w2 hello"}),
                       ("/tokenize", {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}),
                       ("/detokenize", {"model": SERVED, "tokens": [7, 8, 9]})):
        via = httpx.post(router.url + path, json=body, timeout=10)
        direct = httpx.post(pd.prefill_url + path, json=body, timeout=10)
        assert (via.status_code, via.json()) == (direct.status_code, direct.json()) == (200, direct.json())
        assert via.headers["x-request-id"]
    assert httpx.post(router.url + "/detokenize", json={"model": SERVED, "tokens": [7, 8, 9]},
                      timeout=10).json() == {"prompt": "w7 w8 w9"}


def test_engine_refusals_are_relayed(router: RouterProc, pd: SimPair) -> None:
    bad = httpx.post(router.url + "/detokenize", json={"model": SERVED, "tokens": "x"}, timeout=10)
    direct = httpx.post(pd.prefill_url + "/detokenize", json={"model": SERVED, "tokens": "x"}, timeout=10)
    assert bad.status_code == direct.status_code == 400 and bad.json() == direct.json()
    # A generative model serves no pooling routes: vLLM (and the simulator) answer 404, and so does the router.
    for path in ("/v1/embeddings", "/pooling", "/score", "/rerank"):
        r = httpx.post(router.url + path, json={"model": SERVED, "input": "w1"}, timeout=10)
        assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
    assert corrupt(pd.prefill, pd.decode) == 0


def test_version_and_one_model(router: RouterProc, pd: SimPair) -> None:
    assert httpx.get(router.url + "/version", timeout=10).json() == httpx.get(pd.decode_url + "/version").json()
    one = httpx.get(f"{router.url}/v1/models/{SERVED}", timeout=10)
    listed = httpx.get(f"{pd.decode_url}/v1/models", timeout=10).json()["data"][0]
    assert one.status_code == 200 and one.json()["id"] == SERVED and one.json()["root"] == listed["root"]
    assert_openai_error(httpx.get(f"{router.url}/v1/models/other", timeout=10), 404,
                        "The model `other` does not exist.")


def test_unknown_routes_and_methods_stay_refused(router: RouterProc) -> None:
    assert_openai_error(httpx.post(router.url + "/v1/audio/transcriptions", json={}, timeout=10), 404,
                        "no route POST /v1/audio/transcriptions")
    assert_openai_error(httpx.get(router.url + "/tokenize", timeout=10), 405, "/tokenize takes POST")
    assert_openai_error(httpx.get(router.url + "/v1/responses", timeout=10), 405, "/v1/responses takes POST")


def test_key_and_body_limit_apply(agent_router: RouterProc) -> None:
    url = agent_router.url + "/tokenize"
    r = httpx.post(url, json={"model": SERVED, "prompt": "w1"}, timeout=10)
    assert r.status_code == 401
    auth = {"Authorization": f"Bearer {AGENT_KEY}"}
    assert_openai_error(httpx.post(url, json={"model": SERVED, "prompt": "w1 " * 10000}, headers=auth, timeout=10),
                        413, "request body over the router's limit of 20000 bytes (--max-body-bytes)")
    ok = httpx.post(url, json={"model": SERVED, "prompt": "w1"}, headers={"x-api-key": AGENT_KEY}, timeout=10)
    assert ok.status_code == 200 and ok.json()["tokens"] == [1]
