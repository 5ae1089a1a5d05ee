"""The simulator's /v1/responses and /v1/messages, read by the official SDKs as vLLM's would be."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.support.sim_procs import SERVED, SimProc, sim_process

TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProc]:
    with sim_process(tmp_path_factory.mktemp("sim-agents"), "decode", speed=float("inf")) as s:
        yield s


def test_responses_whole_and_streamed(sim: SimProc) -> None:
    c = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    r = c.responses.create(model=SERVED, input="hello w1", max_output_tokens=5)
    assert r.status == "incomplete" and len(r.output_text.split()) == 5 and r.usage.output_tokens == 5
    called = c.responses.create(model=SERVED, input="find w2", tools=TOOLS)  # type: ignore[arg-type]
    call = called.output[0]
    assert call.type == "function_call" and call.name == "lookup"
    with c.responses.stream(model=SERVED, input=[{"role": "user", "content": "find w2"}, call.model_dump(),
                                                 {"type": "function_call_output", "call_id": call.call_id,
                                                  "output": "done"}], tools=TOOLS) as s:  # type: ignore[arg-type]
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.output_text == "".join(deltas) and final.status == "completed"


def test_messages_whole_and_streamed(sim: SimProc) -> None:
    c = anthropic.Anthropic(base_url=sim.url, api_key="x", max_retries=0)
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    m = c.messages.create(model=SERVED, max_tokens=16, tools=tools,  # type: ignore[list-item]
                          messages=[{"role": "user", "content": "find w3"}])
    assert m.stop_reason == "tool_use" and m.content[0].type == "tool_use" and "query" in m.content[0].input
    with c.messages.stream(model=SERVED, max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content[0].text == text and final.usage.output_tokens == 4
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="other", max_tokens=4, messages=[{"role": "user", "content": "x"}])
