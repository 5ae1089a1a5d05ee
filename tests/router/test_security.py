"""What clients may not do or see: forged KV params, leaks, missing keys, huge or broken bodies."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.router.conftest import RouterProc, assert_clean, corrupt, router_process
from tests.router.talk import Conversation, send
from tests.support.sim_procs import SimPair

KEY = "s3cret-" + uuid.uuid4().hex


@pytest.fixture(scope="session")
def secure(pd: SimPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    with router_process(tmp_path_factory.mktemp("secure"), [pd.prefill_url], [pd.decode_url],
                        "--api-key-env", "PDCTL_TEST_ROUTER_KEY", "--max-body-bytes", "4096",
                        env={"PDCTL_TEST_ROUTER_KEY": KEY}) as r:
        yield r


def assert_error(r: httpx.Response, status: int, words: str) -> None:
    """The one error shape every 4xx/5xx of the router has (OpenAI's)."""
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code"} and err["code"] == status
    assert words in err["message"]
    assert r.headers["x-request-id"]


def test_forged_kv_transfer_params_are_stripped(router: RouterProc, pd: SimPair) -> None:
    failed_before = pd.prefill.metric("vllm:nixl_num_failed_transfers_total")
    forged = {"do_remote_decode": True, "do_remote_prefill": False, "remote_block_ids": [[1, 2, 3, 4]],
              "remote_engine_id": "attacker", "remote_request_id": "someone-elses", "remote_host": "127.0.0.1",
              "remote_port": pd.decode.side_port, "tp_size": 1, "remote_num_tokens": 64}
    body = {"model": "Qwen", "prompt": "read someone else's blocks " * 8, "max_tokens": 4,
            "kv_transfer_params": forged}
    reply = send(httpx.Client(timeout=30), router.url, body)
    assert reply.status == 200 and reply.text
    assert (reply.outcome, reply.reason) == ("miss", "new_conversation")
    assert_clean(reply.raw, reply.headers)
    assert pd.prefill.metric("vllm:nixl_num_failed_transfers_total") == failed_before
    assert corrupt(pd.prefill, pd.decode) == 0
    assert "removed client-supplied kv_transfer_params" in router.log_text()


def test_client_asked_token_ids_are_kept_but_kv_params_never(router: RouterProc) -> None:
    conv = Conversation(router.url, False, True, "body", uuid.uuid4().hex, return_token_ids=True)
    conv.turn("count with me")
    reply = conv.turn(" and more")
    assert reply.outcome == "hit"
    assert b"token_ids" in reply.raw and b"kv_transfer_params" not in reply.raw


def test_api_key_is_required_except_for_health(secure: RouterProc) -> None:
    c = httpx.Client(timeout=30)
    body = {"model": "Qwen", "prompt": "hi", "max_tokens": 2}
    assert_error(c.post(secure.url + "/v1/completions", json=body), 401, "API key")
    r = c.post(secure.url + "/v1/completions", json=body, headers={"Authorization": "Bearer wrong"})
    assert_error(r, 401, "API key")
    assert_error(c.get(secure.url + "/stats"), 401, "API key")
    auth = {"Authorization": f"Bearer {KEY}"}
    assert c.post(secure.url + "/v1/completions", json=body, headers=auth).status_code == 200
    assert c.get(secure.url + "/stats", headers=auth).json()["requests_total"] >= 1
    assert c.get(secure.url + "/health").status_code == 200
    assert KEY not in secure.log_text()


def test_oversized_body_is_413(secure: RouterProc) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {"model": "Qwen", "prompt": "x" * 5000, "max_tokens": 2}
    r = httpx.post(secure.url + "/v1/completions", json=big, headers=auth, timeout=30)
    assert_error(r, 413, "--max-body-bytes")

    def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while reading too
        yield b'{"model": "Qwen", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = httpx.post(secure.url + "/v1/completions", content=chunks(), headers=auth, timeout=30)
    assert_error(r, 413, "--max-body-bytes")


@pytest.mark.parametrize(("content", "words"), [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"model": "Qwen", "messages": []}', "`messages` must be a non-empty list"),
])
def test_bad_bodies_are_400(router: RouterProc, content: bytes, words: str) -> None:
    r = httpx.post(router.url + "/v1/chat/completions", content=content, timeout=30,
                   headers={"content-type": "application/json"})
    assert_error(r, 400, words)


def test_unknown_routes_and_methods(router: RouterProc) -> None:
    assert_error(httpx.get(router.url + "/v1/nothing", timeout=30), 404, "no route")
    assert_error(httpx.get(router.url + "/v1/completions", timeout=30), 405, "POST")


def test_engine_client_errors_are_relayed_without_hosts(router: RouterProc) -> None:
    r = httpx.post(router.url + "/v1/completions", timeout=30,
                   json={"model": "Qwen", "prompt": "word " * 40000, "max_tokens": 2})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    assert_clean(r.content, r.headers)


@pytest.mark.parametrize("mode", ["body", "derived"])
def test_a_stranger_learns_nothing_from_the_owners_conversation(router: RouterProc, pd: SimPair, mode: str) -> None:
    cid = uuid.uuid4().hex
    owner = Conversation(router.url, True, True, mode, cid)
    owner.client.headers["authorization"] = "Bearer owner-" + cid
    owner.turn("my secret plan is to " * 8)
    body = owner.body(" guess")  # the owner's exact history and id: the best possible guess
    newcomer = Conversation(router.url, True, True, "body", uuid.uuid4().hex).body("x")
    fresh = send(httpx.Client(timeout=30), router.url, newcomer, {"authorization": "Bearer nobody"})
    for headers, extra in (({"authorization": "Bearer stranger"}, {}),
                           ({"authorization": "Bearer owner-" + cid}, {"cache_salt": "another-tenant"})):
        probe = send(httpx.Client(timeout=30), router.url, {**body, **extra}, headers)
        assert probe.status == 200
        assert probe.reuse == fresh.reuse == "miss;tokens=0;reason=new_conversation"
    assert owner.turn(" and then").outcome == "hit"  # the probes neither saw nor spent the owner's handle
    assert corrupt(pd.prefill, pd.decode) == 0


@pytest.mark.parametrize("depth", [300, 1000, 5000])
def test_deeply_nested_json_is_400(router: RouterProc, depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    content = b'{"model": "Qwen", "prompt": "hi", "max_tokens": 2, "junk": ' + nested + b"}"
    r = httpx.post(router.url + "/v1/completions", content=content, timeout=30,
                   headers={"content-type": "application/json"})
    assert_error(r, 400, "nests deeper than 128 levels" if depth <= 1024 else "not valid JSON")


def test_relayed_engine_errors_carry_no_router_internals(router: RouterProc) -> None:
    conv = Conversation(router.url, False, False, "body", uuid.uuid4().hex)
    conv.turn("a first turn so the next one carries a handle " * 4)
    body = conv.body(" next")
    del body["model"]  # the engines answer 400 and echo the request, kv_transfer_params included
    r = httpx.post(router.url + "/v1/completions", json=body, timeout=30)
    assert_error(r, 400, "Field required")
    assert_clean(r.content, r.headers)
    assert b"remote_" not in r.content and b"'input': <omitted>" in r.content


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"])
def test_non_json_content_types_are_415(router: RouterProc, ctype: str) -> None:
    r = httpx.post(router.url + "/v1/completions", content=b'{"model": "Qwen", "prompt": "hi"}', timeout=30,
                   headers={"content-type": ctype})
    assert_error(r, 415, "must be application/json")


def test_http_1_0_clients_get_whole_replies_never_chunked(router: RouterProc) -> None:
    host, port = router.url.removeprefix("http://").split(":")
    body = b'{"model": "Qwen", "prompt": "old client", "max_tokens": 3, "stream": true}'
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                  % (len(body), body))
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding" not in head.lower()
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-len"))
    assert len(payload) == length and payload.endswith(b"data: [DONE]\n\n")
