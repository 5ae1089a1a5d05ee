from __future__ import annotations

from pdctl.router.kv.conversation import DerivedIndex, explicit_id, prompt_text

SYS = {"role": "system", "content": "be brief"}


def test_explicit_id_body_wins_then_headers() -> None:
    assert explicit_id("abc", {"x-session-id": "zzz"}) == "c:abc"
    assert explicit_id(None, {"x-session-id": "zzz"}) == "c:zzz"
    assert explicit_id(None, {"x-conversation-id": "q", "x-session-id": "zzz"}) == "c:q"
    assert explicit_id(None, {}) is None
    assert explicit_id("x" * 1000, {}) is None


def test_chat_continues_when_history_equals_messages_plus_reply() -> None:
    index = DerivedIndex()
    turn1 = [SYS, {"role": "user", "content": "hi"}]
    d1 = index.derive_chat(turn1)
    assert d1.cid is None
    key = d1.reply_key({"content": "hello there"}, None)
    index.add(key, "d:1")
    turn2 = [*turn1, {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "more"}]
    assert index.derive_chat(turn2).cid == "d:1"
    # list-form content and reasoning fields do not matter for finding the conversation
    edited = [
        SYS,
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello there ", "reasoning_content": "hmm"},
        {"role": "user", "content": "more"},
    ]
    assert index.derive_chat(edited).cid == "d:1"
    thought = [*turn1, {"role": "assistant", "content": "<think>hmm</think>\n\nhello there"}]
    index.add(index.derive_chat(turn1).reply_key({"content": "<think>x</think>hello there"}, None), "d:2")
    assert index.derive_chat([*thought, {"role": "user", "content": "more"}]).cid == "d:2"
    assert index.derive_chat(turn2).cid == "d:2"  # the reasoning-stripped history finds it too
    index.discard(index.derive_chat(turn1).reply_key({"content": "hello there"}, None), "d:2")
    other = [
        SYS,
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "bye"},
        {"role": "user", "content": "more"},
    ]
    assert index.derive_chat(other).cid is None
    index.discard(key, "d:1")
    assert index.derive_chat(turn2).cid is None


def test_chat_tool_calls_are_part_of_the_reply() -> None:
    index = DerivedIndex()
    turn1 = [{"role": "user", "content": "weather?"}]
    call = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    index.add(index.derive_chat(turn1).reply_key({"content": "", "tool_calls": [{"function": call}]}, None), "d:t")
    turn2 = [
        *turn1,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert index.derive_chat(turn2).cid == "d:t"


def test_completions_continue_when_the_prompt_extends_prompt_plus_reply() -> None:
    index = DerivedIndex()
    for n, prompt in enumerate(("short prompt", "p" * 3000)):  # under and over one hashing chunk
        d = index.derive_prompt(prompt)
        assert d.cid is None
        index.add(d.reply_key({"content": " and a reply"}, None), f"d:{n}")
        assert index.derive_prompt(prompt + " and a reply\nnext question").cid == f"d:{n}"
        assert index.derive_prompt(prompt + " and another reply").cid is None


def test_token_prompts_continue_with_the_output_token_ids() -> None:
    index = DerivedIndex()
    d = index.derive_prompt([1, 2, 3])
    assert d.kind == "tokens"
    index.add(d.reply_key({"content": "ignored"}, [7, 8]), "d:tok")
    assert index.derive_prompt([1, 2, 3, 7, 8, 9]).cid == "d:tok"
    assert index.derive_prompt([1, 2, 3, 7, 9]).cid is None


def test_batches_cannot_take_part() -> None:
    assert prompt_text(["a", "b"]) is None
    assert DerivedIndex().derive_prompt([[1, 2], [3]]).kind == "none"


def test_a_long_token_prompt_nested_once_continues_like_a_flat_one() -> None:
    index = DerivedIndex()
    history = list(range(100, 24_100))  # many chunks: the match must use the whole prefix, not a chunk boundary
    index.add(index.derive_prompt([history]).reply_key({}, [5, 6]), "d:long")
    assert index.derive_prompt([*history, 5, 6, 1]).cid == "d:long"
    assert index.derive_prompt([[*history, 5, 6, 1]]).cid == "d:long"
    assert index.derive_prompt([*history[:-1], 7, 5, 6, 1]).cid is None
    # a text prompt that spells the same ids is another conversation
    assert index.derive_prompt("".join(f"{t}," for t in history) + "5,6,1").cid is None


def test_prompts_that_are_not_token_ids_take_no_part() -> None:
    assert prompt_text([1, "2"]) is None
    assert prompt_text([1, 2.5]) is None
    assert prompt_text([1, 2**40]) is None
    assert DerivedIndex().derive_prompt([1, None]).kind == "none"
