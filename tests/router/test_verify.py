from __future__ import annotations

from array import array

from pdctl.router.verify import as_tokens, matching_blocks, truncate, verify

BS = 4


def params(n: int, blocks: int) -> dict:
    return {"do_remote_decode": True, "do_remote_prefill": False, "remote_block_ids": [list(range(10, 10 + blocks))],
            "remote_engine_id": "d", "remote_request_id": "r", "remote_host": "10.0.0.2", "remote_port": 5601,
            "tp_size": 1, "remote_num_tokens": n, "remote_blocks_expiry_time": 805.5, "transfer_mode": "pull"}


def test_full_match_and_longer_prompt_is_a_hit_with_the_params_untouched() -> None:
    held = array("i", range(10))
    v = verify(params(10, 3), held, array("i", range(14)), BS)
    assert (v.outcome, v.reason, v.tokens) == ("hit", "verified", 10)
    assert v.params == params(10, 3)  # host, expiry, unknown keys pass through
    assert v.header == "hit;tokens=10;reason=verified"


def test_retried_turn_is_a_miss() -> None:
    held = array("i", range(10))
    for prompt in (range(10), range(8)):
        v = verify(params(10, 3), held, array("i", prompt), BS)
        assert (v.outcome, v.reason) == ("miss", "prompt_not_longer")
        assert v.params["remote_block_ids"] is None


def test_divergence_reuses_whole_verified_blocks_only() -> None:
    held = array("i", range(10))
    prompt = array("i", [*range(6), 99, *range(7, 20)])  # differs at token 6: block 0 verified, block 1 not
    v = verify(params(10, 3), held, prompt, BS)
    assert (v.outcome, v.tokens) == ("partial", 4)
    assert v.params["remote_block_ids"] == [[10]] and v.params["remote_num_tokens"] == 4
    assert v.params["remote_host"] == "10.0.0.2"


def test_divergence_in_the_first_block_or_with_partial_off_is_a_miss() -> None:
    held = array("i", range(10))
    assert verify(params(10, 3), held, array("i", [7, *range(1, 20)]), BS).outcome == "miss"
    prompt = array("i", [*range(6), 99, *range(7, 20)])
    v = verify(params(10, 3), held, prompt, BS, partial_ok=False)
    assert (v.outcome, v.reason) == ("miss", "prefix_diverged")


def test_unknown_tokens_are_a_miss() -> None:
    assert verify(params(10, 3), None, array("i", range(20)), BS).reason == "tokens_unknown"
    assert verify(params(10, 3), array("i", range(5)), array("i", range(20)), BS).reason == "tokens_unknown"


def test_truncate_cuts_every_group_and_flat_lists() -> None:
    p = params(12, 3)
    p["remote_block_ids"] = [[1, 2, 3], [4, 5, 6]]
    assert truncate(p, 2, BS)["remote_block_ids"] == [[1, 2], [4, 5]]
    p["remote_block_ids"] = [1, 2, 3]
    out = truncate(p, 1, BS)
    assert out["remote_block_ids"] == [1] and out["remote_num_tokens"] == 4


def test_matching_blocks_counts_leading_equal_blocks() -> None:
    a = array("i", range(16))
    for diverge, want in ((0, 0), (3, 0), (4, 1), (9, 2), (15, 3)):
        b = array("i", a)
        b[diverge] = -1
        assert matching_blocks(a, b, BS) == want
    assert matching_blocks(a, a, BS) == 4


def test_as_tokens_rejects_what_is_not_token_ids() -> None:
    assert as_tokens([1, 2]) == array("i", [1, 2])
    assert as_tokens(["a"]) is None and as_tokens([2**40]) is None and as_tokens("x") is None
