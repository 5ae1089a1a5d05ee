from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from pdctl.bench.traffic.workload import Conversation, WorkloadSpec, build
from pdctl.errors import UsageError


def _play(conv: Conversation, reply_len: int = 5) -> list[dict]:
    bodies = []
    while not conv.done:
        body = conv.body("m", 8)
        bodies.append(body)
        conv.advance(" ".join(f"r{conv.turn}w{i}" for i in range(reply_len)), list(range(7, 7 + reply_len)))
    return bodies


def test_chat_turns_grow_by_exactly_the_reply_and_one_user_message() -> None:
    spec = WorkloadSpec(lengths=(300,), conversations=2, turns=4, user_tokens=20, seed=3)
    plans = build(spec)
    assert [p.key for p in plans] == ["L300-c0", "L300-c1"]
    bodies = _play(Conversation(plans[0], "chat", "on-L300-c0"))
    assert len(bodies) == 4
    first = bodies[0]["messages"]
    assert len(first) == 1 and len(first[0]["content"].split()) == 300
    for k in range(1, 4):
        prev, cur = bodies[k - 1]["messages"], bodies[k]["messages"]
        assert cur[: len(prev)] == prev
        assert [m["role"] for m in cur[len(prev) :]] == ["assistant", "user"]
        assert cur[len(prev)]["content"] == " ".join(f"r{k - 1}w{i}" for i in range(5))
        assert len(cur[-1]["content"].split()) == 20
    assert all(b["conversation_id"] == "on-L300-c0" and b["ignore_eos"] and b["stream"] for b in bodies)


def test_token_id_turns_grow_by_exactly_the_generated_ids_and_new_ids() -> None:
    spec = WorkloadSpec(lengths=(64, 128), conversations=1, turns=3, user_tokens=16, api="completions")
    plans = build(spec)
    bodies = _play(Conversation(plans[1], "completions", "x"), reply_len=4)
    prompts = [b["prompt"] for b in bodies]
    assert [len(p) for p in prompts] == [128, 128 + 4 + 16, 128 + 2 * (4 + 16)]
    for prev, cur in itertools.pairwise(prompts):
        assert cur[: len(prev)] == prev
        assert cur[len(prev) : len(prev) + 4] == [7, 8, 9, 10]
    assert all(b["return_token_ids"] for b in bodies)


def test_same_seed_same_workload_other_seed_other_text() -> None:
    spec = WorkloadSpec(lengths=(200,), conversations=3, turns=2, user_tokens=10, seed=1)
    assert build(spec) == build(spec)
    other = build(WorkloadSpec(lengths=(200,), conversations=3, turns=2, user_tokens=10, seed=2))
    assert other[0].first != build(spec)[0].first
    firsts = [p.first for p in build(spec)]
    assert len(set(firsts)) == 3


def test_tokens_per_word_scales_the_text() -> None:
    spec = WorkloadSpec(lengths=(600,), conversations=1, turns=2, user_tokens=60, tokens_per_word=1.5)
    plan = build(spec)[0]
    assert len(str(plan.first).split()) == 400
    assert len(str(plan.users[0]).split()) == 40


def test_text_file_and_sharegpt_corpus(tmp_path: Path) -> None:
    text = tmp_path / "book.txt"
    text.write_text(" ".join(f"word{i}" for i in range(1000)))
    plan = build(WorkloadSpec(lengths=(50,), conversations=2, turns=2, user_tokens=5, source=text))
    assert "word0 word1 word2" in str(plan[0].first)
    assert "word0" not in str(plan[1].first)  # windows do not overlap
    share = tmp_path / "sg.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello " * 200}]}]))
    assert "hello" in str(build(WorkloadSpec(lengths=(30,), conversations=1, turns=1, source=share))[0].first)


def test_bad_inputs_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read corpus"):
        build(WorkloadSpec(source=tmp_path / "missing.txt"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(UsageError, match=r"bad\.json:1: not valid JSON"):
        build(WorkloadSpec(lengths=(10,), source=bad))
    with pytest.raises(UsageError, match="--turns must be at least 1"):
        WorkloadSpec(turns=0)
