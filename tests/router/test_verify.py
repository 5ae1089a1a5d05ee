from __future__ import annotations

from array import array

from pdctl import prefix_check
from pdctl.router import wire
from pdctl.router.turn.verify import as_tokens, at_prefill, matching_blocks, settle, truncate, verify

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


def test_at_prefill_the_handle_reads_nothing_until_the_prefill_verified_it() -> None:
    spec = prefix_check.spec(list(range(10)), 10, BS)
    v = at_prefill(params(10, 3), spec)
    assert v.pending and (v.outcome, v.tokens) == ("hit", 10)
    assert v.params == {**params(10, 3), "remote_num_tokens": 0, prefix_check.FIELD: spec}
    assert at_prefill(params(10, 3), None).header == "miss;tokens=0;reason=tokens_unknown"  # no ids, no digests


def test_the_verdict_is_the_prefills_report_and_the_decode_never_gets_it() -> None:
    pending = at_prefill(params(10, 3), prefix_check.spec(list(range(10)), 10, BS))
    report = {"outcome": "partial", "tokens": 8, "reason": "prefix_diverged"}
    answer = {"remote_engine_id": "p", prefix_check.REPORT: report, prefix_check.FIELD: {"v": 1}}
    v = settle(pending, answer)
    assert v is not None and v.header == "partial;tokens=8;reason=prefix_diverged" and not v.pending
    assert answer == {"remote_engine_id": "p"}  # what goes on to the decode
    miss_report = {"outcome": "miss", "tokens": 0, "reason": "prompt_not_longer"}
    v = settle(pending, {prefix_check.REPORT: miss_report})
    assert v is not None and v.header == "miss;tokens=0;reason=prompt_not_longer"
    assert v.params["remote_block_ids"] is None


def test_no_report_or_an_unreadable_one_settles_nothing() -> None:
    pending = at_prefill(params(10, 3), prefix_check.spec(list(range(10)), 10, BS))
    for report in (None, "hit", {"outcome": "hit", "tokens": 12, "reason": "verified"},  # more than it holds
                   {"outcome": "hit", "tokens": 8, "reason": "verified"}, {"outcome": "miss", "tokens": 4,
                   "reason": "prefix_diverged"}, {"outcome": "hit", "tokens": 10, "reason": "because"},
                   {"outcome": "hit", "tokens": True, "reason": "verified"}):
        assert settle(pending, {prefix_check.REPORT: report} if report is not None else {}) is None, report
    assert settle(pending, None) is None
    done = verify(params(10, 3), array("i", range(10)), array("i", range(14)), BS)  # verified by the router
    assert settle(done, {prefix_check.REPORT: {"outcome": "miss"}}) is done


def test_the_prefills_reasons_are_the_routers() -> None:
    for reason in (prefix_check.VERIFIED, prefix_check.PREFIX_DIVERGED, prefix_check.PROMPT_NOT_LONGER,
                   prefix_check.SPEC_INVALID):
        assert reason in wire.REASONS
