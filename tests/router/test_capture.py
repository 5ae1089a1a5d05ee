from __future__ import annotations

import json

from pdctl.router.turn.capture import Capture, SseRewriter

HANDLE = {"do_remote_prefill": False, "do_remote_decode": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "e",
          "remote_request_id": "r", "remote_host": "10.1.1.1", "remote_port": 5601, "tp_size": 1,
          "remote_num_tokens": 5, "remote_blocks_expiry_time": 805.5}


def chunk(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def completion_stream() -> bytes:
    return b"".join([
        chunk({"id": "x", "choices": [{"index": 0, "text": " a", "finish_reason": None,
                                       "prompt_token_ids": [1, 2, 3], "token_ids": [7]}], "kv_transfer_params": None}),
        chunk({"id": "x", "choices": [{"index": 0, "text": " b", "finish_reason": None, "prompt_token_ids": None,
                                       "token_ids": [8]}], "kv_transfer_params": None}),
        chunk({"id": "x", "choices": [{"index": 0, "text": " c", "finish_reason": "length", "prompt_token_ids": None,
                                       "token_ids": [9]}], "kv_transfer_params": HANDLE}),
        b"data: [DONE]\n\n",
    ])


def test_stream_split_anywhere_gives_the_same_capture_and_strips_internals() -> None:
    raw = completion_stream()
    for step in (1, 7, 64, len(raw)):
        cap = Capture(chat=False, keep_ids=False)
        sse = SseRewriter(cap)
        out = b"".join(sse.feed(raw[i:i + step]) for i in range(0, len(raw), step)) + sse.flush()
        assert cap.params == HANDLE and cap.finished
        assert cap.held_tokens() == [1, 2, 3, 7, 8]
        assert cap.reply() == {"content": " a b c"}
        assert b"kv_transfer_params" not in out and b"token_ids" not in out and b"10.1.1.1" not in out
        assert out.count(b"data: ") == 4 and out.endswith(b"data: [DONE]\n\n")


def test_ids_stay_when_the_client_asked_for_them() -> None:
    cap = Capture(chat=False, keep_ids=True)
    out = SseRewriter(cap).feed(completion_stream())
    assert b'"token_ids":[7]' in out and b"kv_transfer_params" not in out
    assert cap.held_tokens() == [1, 2, 3, 7, 8]


def test_chat_whole_body_with_tool_calls() -> None:
    body = {"id": "c", "object": "chat.completion", "prompt_token_ids": [1, 2, 3],
            "choices": [{"index": 0, "finish_reason": "tool_calls", "token_ids": [4, 5, 6],
                         "message": {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
            "kv_transfer_params": HANDLE}
    cap = Capture(chat=True, keep_ids=False)
    cap.take(body, whole=True)
    assert "kv_transfer_params" not in body and "prompt_token_ids" not in body
    assert "token_ids" not in body["choices"][0]
    assert cap.reply() == {"content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    assert cap.held_tokens() == [1, 2, 3, 4, 5]


def test_no_ids_means_no_held_tokens() -> None:
    cap = Capture(chat=True, keep_ids=False)
    cap.take({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}],
              "kv_transfer_params": HANDLE})
    assert cap.params == HANDLE and cap.held_tokens() is None


def test_a_local_turn_caches_all_but_the_last_sampled_token() -> None:
    cap = Capture(chat=False, keep_ids=False)
    SseRewriter(cap).feed(completion_stream())
    assert cap.computed_tokens() == [1, 2, 3, 7, 8]  # 9 was sampled last: no KV for it yet
    assert Capture(chat=False, keep_ids=False).computed_tokens() is None  # no ids seen: nothing to claim
