from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pdctl import prefix_check
from pdctl.prefix_check import FIELD, REPORT, check, chunk_tokens, spec

HELD = list(range(1000, 1000 + 700))  # 700 tokens: two whole 256-token chunks and 188 more


def params(held: list[int], n: int, block_size: int = 16, partial: bool = True, min_read: int = 0) -> dict[str, Any]:
    blocks = -(-n // block_size)
    p: dict[str, Any] = {"do_remote_decode": True, "remote_block_ids": [list(range(blocks))],
                         "remote_engine_id": "d", "remote_num_tokens": 0}
    p[FIELD] = json.loads(json.dumps(spec(held, n, block_size, partial, min_read)))  # as it travels
    return p


def test_chunk_is_whole_blocks_of_at_least_256_tokens() -> None:
    assert [chunk_tokens(b) for b in (16, 64, 100, 256, 512)] == [256, 256, 300, 256, 512]


def test_a_strictly_longer_prompt_with_the_same_prefix_is_a_hit() -> None:
    p = params(HELD, 700)
    assert check(p, [*HELD, 5, 6]) == {"outcome": "hit", "tokens": 700, "reason": "verified", "cached": 0, "read": 700}
    assert p["remote_num_tokens"] == 700 and FIELD not in p and p[REPORT]["outcome"] == "hit"
    assert p["remote_block_ids"] == [list(range(44))]


def test_a_prompt_no_longer_than_the_held_tokens_reads_nothing() -> None:
    p = params(HELD, 700)
    assert check(p, HELD) == {"outcome": "miss", "tokens": 0, "reason": "prompt_not_longer", "cached": 0, "read": 0}
    assert p["remote_num_tokens"] == 0


def test_divergence_inside_the_tail_keeps_the_whole_chunks_before_it() -> None:
    prompt = [*HELD[:600], 7, *HELD[601:], 1]
    p = params(HELD, 700)
    assert check(p, prompt) == {"outcome": "partial", "tokens": 512, "reason": "prefix_diverged",
                               "cached": 0, "read": 512, "diverged_at": 512}
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
    assert check(p, prompt) == {"outcome": "miss", "tokens": 0, "reason": "prefix_diverged", "cached": 0, "read": 0,
                               "diverged_at": at}
    assert p["remote_num_tokens"] == 0 and p["remote_block_ids"] == [list(range(44))]


def test_a_short_handle_has_no_chunks_and_is_checked_whole() -> None:
    p = params(HELD, 100)
    assert check(p, HELD[:101])["outcome"] == "hit"
    q = params(HELD, 100)
    assert check(q, [*HELD[:99], 0, 1]) == {"outcome": "miss", "tokens": 0, "reason": "prefix_diverged",
                                            "cached": 0, "read": 0, "diverged_at": 0}


@pytest.mark.parametrize("bad", [None, 3, {"v": 2}, {"v": 1, "n": 700, "block_size": 16, "step": 255,
                                                        "chain": [], "full": ""}])
def test_a_malformed_spec_is_a_miss(bad: Any) -> None:
    p = params(HELD, 700)
    p[FIELD] = bad
    if bad is None:
        assert check(p, [*HELD, 1]) is None and p["remote_num_tokens"] == 0
        return
    assert check(p, [*HELD, 1]) == {"outcome": "miss", "tokens": 0, "reason": "prefix_spec_invalid",
                                   "cached": 0, "read": 0}
    assert p["remote_num_tokens"] == 0


def test_checked_twice_is_checked_once() -> None:
    """vLLM may ask the connector again while the request waits for blocks: the spec is gone after the first."""
    p = params(HELD, 700)
    check(p, [*HELD, 1])
    assert check(p, [0] * 800) is None and p["remote_num_tokens"] == 700


def test_imports_nothing_of_pdctl() -> None:
    source = Path(prefix_check.__file__).read_text()
    assert "import pdctl" not in source and "from pdctl" not in source


# The cheapest source (issue 29): the prefill's own cache, then the decode's KV for what it lacks, then recompute.

def test_a_prefill_cache_holding_the_whole_prefix_reads_nothing() -> None:
    p = params(HELD, 700, min_read=256)
    assert check(p, [*HELD, 5, 6], cached=702) == {"outcome": "hit", "tokens": 700, "reason": "prefill_cached",
                                                   "cached": 702, "read": 0}
    assert p["remote_num_tokens"] == 0 and p["remote_block_ids"]  # kept: the decode is told to free them


def test_a_prefill_cache_lacking_fewer_than_min_read_tokens_computes_them() -> None:
    p = params(HELD, 700, min_read=256)
    assert check(p, [*HELD, 5], cached=608) == {"outcome": "hit", "tokens": 608, "reason": "prefill_cached",
                                                "cached": 608, "read": 0}
    assert p["remote_num_tokens"] == 0


def test_a_prefill_cache_holding_part_reads_only_what_it_lacks() -> None:
    p = params(HELD, 700, min_read=256)
    assert check(p, [*HELD, 5], cached=304) == {"outcome": "hit", "tokens": 700, "reason": "verified",
                                                "cached": 304, "read": 396}
    assert p["remote_num_tokens"] == 700  # vLLM reads remote_num_tokens less its own num_computed_tokens


def test_nothing_cached_and_too_little_to_be_worth_a_read_is_a_miss() -> None:
    p = params(HELD[:200], 200, min_read=256)
    assert check(p, [*HELD[:200], 5]) == {"outcome": "miss", "tokens": 0, "reason": "read_not_worth",
                                          "cached": 0, "read": 0}
    assert p["remote_num_tokens"] == 0


def test_a_spec_without_min_read_reads_whatever_the_cache_lacks() -> None:
    p = params(HELD, 700)
    del p[FIELD]["min_read"]  # a router one release older
    assert check(p, [*HELD, 5], cached=688)["read"] == 12
