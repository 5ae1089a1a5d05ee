from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdctl import prefix_check
from pdctl.prefix_check import FIELD, REPORT, check, chunk_tokens, spec

HELD = list(range(1000, 1000 + 700))  # 700 tokens: two whole 256-token chunks and 188 more


def params(held: list[int], n: int, block_size: int = 16, partial: bool = True) -> dict[str, Any]:
    blocks = -(-n // block_size)
    p: dict[str, Any] = {"do_remote_decode": True, "remote_block_ids": [list(range(blocks))],
                         "remote_engine_id": "d", "remote_num_tokens": 0}
    p[FIELD] = json.loads(json.dumps(spec(held, n, block_size, partial)))  # as it travels
    return p


def test_chunk_is_whole_blocks_of_at_least_256_tokens() -> None:
    assert [chunk_tokens(b) for b in (16, 64, 100, 256, 512)] == [256, 256, 300, 256, 512]


def test_a_strictly_longer_prompt_with_the_same_prefix_is_a_hit() -> None:
    p = params(HELD, 700)
    assert check(p, [*HELD, 5, 6]) == {"outcome": "hit", "tokens": 700, "reason": "verified"}
    assert p["remote_num_tokens"] == 700 and FIELD not in p and p[REPORT]["outcome"] == "hit"
    assert p["remote_block_ids"] == [list(range(44))]


def test_a_prompt_no_longer_than_the_held_tokens_reads_nothing() -> None:
    p = params(HELD, 700)
    assert check(p, HELD) == {"outcome": "miss", "tokens": 0, "reason": "prompt_not_longer"}
    assert p["remote_num_tokens"] == 0


def test_divergence_inside_the_tail_keeps_the_whole_chunks_before_it() -> None:
    prompt = [*HELD[:600], 7, *HELD[601:], 1]
    p = params(HELD, 700)
    assert check(p, prompt) == {"outcome": "partial", "tokens": 512, "reason": "prefix_diverged", "diverged_at": 512}
    assert p["remote_num_tokens"] == 512 and p["remote_block_ids"] == [list(range(32))]


def test_divergence_in_a_chunk_keeps_the_chunks_before_it_only() -> None:
    prompt = [*HELD[:300], 7, *HELD[301:], 1]
    p = params(HELD, 700)
    assert check(p, prompt)["tokens"] == 256
    flat = params(HELD, 700)
    flat["remote_block_ids"] = list(range(44))
    check(flat, prompt)
    assert flat["remote_block_ids"] == list(range(16))


@pytest.mark.parametrize(("prompt", "at"), [([7, *HELD[1:], 1], 0), ([*HELD[:300], 7, *HELD[301:], 1], 256)])
def test_without_partial_reuse_any_divergence_is_a_miss(prompt: list[int], at: int) -> None:
    p = params(HELD, 700, partial=False)
    assert check(p, prompt) == {"outcome": "miss", "tokens": 0, "reason": "prefix_diverged", "diverged_at": at}
    assert p["remote_num_tokens"] == 0 and p["remote_block_ids"] == [list(range(44))]


def test_a_short_handle_has_no_chunks_and_is_checked_whole() -> None:
    p = params(HELD, 100)
    assert check(p, HELD[:101])["outcome"] == "hit"
    q = params(HELD, 100)
    assert check(q, [*HELD[:99], 0, 1]) == {"outcome": "miss", "tokens": 0, "reason": "prefix_diverged",
                                             "diverged_at": 0}


@pytest.mark.parametrize("bad", [None, 3, {"v": 2}, {"v": 1, "n": 700, "block_size": 16, "step": 255,
                                                        "chain": [], "full": ""}])
def test_a_malformed_spec_is_a_miss(bad: Any) -> None:
    p = params(HELD, 700)
    p[FIELD] = bad
    if bad is None:
        assert check(p, [*HELD, 1]) is None and p["remote_num_tokens"] == 0
        return
    assert check(p, [*HELD, 1]) == {"outcome": "miss", "tokens": 0, "reason": "prefix_spec_invalid"}
    assert p["remote_num_tokens"] == 0


def test_checked_twice_is_checked_once() -> None:
    """vLLM may ask the connector again while the request waits for blocks: the spec is gone after the first."""
    p = params(HELD, 700)
    check(p, [*HELD, 1])
    assert check(p, [0] * 800) is None and p["remote_num_tokens"] == 700


def test_imports_nothing_of_pdctl() -> None:
    source = Path(prefix_check.__file__).read_text()
    assert "import pdctl" not in source and "from pdctl" not in source
