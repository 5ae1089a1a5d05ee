"""The OpenAI surface of one simulator process: shapes, bad input, metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.sim_procs import SimProc, sim_process

METRICS = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
           "vllm:nixl_xfer_time_seconds_count", "vllm:nixl_bytes_transferred_sum", "vllm:nixl_num_descriptors_sum",
           "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_kv_expired_reqs_total", "vllm:prompt_tokens_total",
           "vllm:generation_tokens_total", "pdctl_sim_corrupt_reuse_total"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProc]:
    with sim_process(tmp_path_factory.mktemp("sim-api"), "decode", speed=float("inf"), max_model_len=4096) as s:
        yield s


def assert_error(r: httpx.Response, status: int, err_type: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status and body["error"]["type"] == err_type
    return body["error"]


@pytest.mark.parametrize(
    ("body", "status", "err_type", "param"),
    [
        ('{"model": "Qwen", prompt: 1}', 400, "Bad Request", "body.18"),
        ({"prompt": "hi"}, 400, "Bad Request", "body.model"),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "NotFoundError", "model"),
        ({"model": "Qwen", "prompt": "hi", "max_tokens": -3}, 400, "BadRequestError", "max_tokens"),
        ({"model": "Qwen", "prompt": "hi", "max_tokens": 2, "min_tokens": 5}, 400, "BadRequestError", "min_tokens"),
        ({"model": "Qwen", "prompt": list(range(5000)), "max_tokens": 1}, 400, "BadRequestError", "input_tokens"),
        ({"model": "Qwen", "prompt": {"x": 1}}, 400, "BadRequestError", "prompt"),
    ],
)
def test_bad_input_gets_vllm_errors(sim: SimProc, body: Any, status: int, err_type: str, param: str) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{sim.url}/v1/completions", content=content, headers={"content-type": "application/json"})
    assert assert_error(r, status, err_type)["param"] == param
    assert httpx.get(f"{sim.url}/health").status_code == 200


def test_prompt_over_max_model_len_message(sim: SimProc) -> None:
    r = httpx.post(f"{sim.url}/v1/completions", json={"model": "Qwen", "prompt": list(range(5000)), "max_tokens": 1})
    assert assert_error(r, 400, "BadRequestError")["message"] == (
        "This model's maximum context length is 4096 tokens. However, you requested 1 output tokens and your "
        "prompt contains 5000 input tokens, for a total of 5001 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens. (parameter=input_tokens, value=5000)"
    )


def test_models_and_tokenize(sim: SimProc) -> None:
    models = httpx.get(f"{sim.url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "Qwen"
    assert models["data"][0]["max_model_len"] == 4096
    tok = httpx.post(f"{sim.url}/tokenize", json={"model": "Qwen", "prompt": "w5 w6 w7"}).json()
    assert tok == {"count": 3, "max_model_len": 4096, "tokens": [5, 6, 7], "token_strs": None}  # as vLLM
    asked = httpx.post(f"{sim.url}/tokenize", json={"prompt": "w5 w6 w7", "return_token_strs": True}).json()
    assert asked["token_strs"] == ["w5", "w6", "w7"]
    messages = [{"role": "user", "content": "hello"}]
    chat_tok = httpx.post(f"{sim.url}/tokenize", json={"model": "Qwen", "messages": messages}).json()
    body = {"model": "Qwen", "messages": messages, "max_tokens": 3, "return_token_ids": True}
    chat = httpx.post(f"{sim.url}/v1/chat/completions", json=body).json()
    assert chat["prompt_token_ids"] == chat_tok["tokens"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 3 == len(chat["choices"][0]["token_ids"])
    retok = httpx.post(f"{sim.url}/tokenize", json={"prompt": chat["choices"][0]["message"]["content"]}).json()
    assert retok["tokens"] == chat["choices"][0]["token_ids"]
    assert chat["kv_transfer_params"] is None  # no P/D params in, none out


def test_tokenizer_work_is_counted(sim: SimProc) -> None:
    calls = sim.metric("pdctl_sim_tokenize_requests_total")
    nbytes = sim.metric("pdctl_sim_tokenize_response_bytes_total")
    encoded = sim.metric("pdctl_sim_encoded_prompt_tokens_total")
    plain = httpx.post(f"{sim.url}/tokenize", json={"prompt": "w5 w6 w7"})
    strs = httpx.post(f"{sim.url}/tokenize", json={"prompt": "w5 w6 w7", "return_token_strs": True})
    assert sim.metric("pdctl_sim_tokenize_requests_total") == calls + 2
    assert sim.metric("pdctl_sim_tokenize_response_bytes_total") == nbytes + len(plain.content) + len(strs.content)
    httpx.post(f"{sim.url}/v1/completions", json={"model": "Qwen", "prompt": [5, 6, 7], "max_tokens": 1})
    assert sim.metric("pdctl_sim_encoded_prompt_tokens_total") == encoded  # token ids skip the tokenizer
    httpx.post(f"{sim.url}/v1/completions", json={"model": "Qwen", "prompt": "w5 w6 w7", "max_tokens": 1})
    assert sim.metric("pdctl_sim_encoded_prompt_tokens_total") == encoded + 3


def test_stream_with_usage_and_request_id(sim: SimProc) -> None:
    body = {"model": "Qwen", "prompt": "a b c", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{sim.url}/v1/completions", json=body, headers={"X-Request-Id": "abc123"}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert {c["id"] for c in chunks} == {"cmpl-abc123"}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7


def test_defaults_without_max_tokens_stop(sim: SimProc) -> None:
    chat = httpx.post(f"{sim.url}/v1/chat/completions",
                      json={"model": "Qwen", "messages": [{"role": "user", "content": "x"}]}).json()
    assert chat["choices"][0]["finish_reason"] == "stop" and chat["usage"]["completion_tokens"] == 64


def test_metrics_names(sim: SimProc) -> None:
    text = httpx.get(f"{sim.url}/metrics").text
    for name in METRICS:
        assert f"\n{name}{{" in text, name
    assert 'model_name="Qwen"' in text
