"""The two-hop flow by hand against real simulator processes: reuse, the integrity oracle, the hazards."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.sim.helpers import output_ids, prefill, text_of, two_hop, wait_until
from tests.support.sim_procs import SimPair, sim_pair

CORRUPT = "pdctl_sim_corrupt_reuse_total"
READS = "vllm:nixl_xfer_time_seconds_count"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimPair]:
    logs = tmp_path_factory.mktemp("sim-pair")
    with sim_pair(logs, speed=1000, threshold=0, prefill_args=["--log-stats-interval", "0.2"]) as p:
        yield p


def test_turn2_reuses_decode_blocks_without_corruption(pair: SimPair) -> None:
    reads_p, reads_d = pair.prefill.metric(READS), pair.decode.metric(READS)
    turn1 = list(range(2000, 2300))
    chunks, handle = two_hop(pair, {"prompt": turn1}, max_tokens=8)
    out = output_ids(chunks)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == turn1
    assert handle["do_remote_decode"] is True and handle["do_remote_prefill"] is False
    assert handle["remote_num_tokens"] == len(turn1) + len(out) - 1
    assert len(handle["remote_block_ids"][0]) == -(-(len(turn1) + 7) // 16)
    assert isinstance(handle["remote_blocks_expiry_time"], float)
    assert pair.decode.metric(READS) == reads_d + 1  # D pulled P's blocks

    turn2 = turn1 + out + list(range(3000, 3100))
    _, handle2 = two_hop(pair, {"prompt": turn2}, d_handle=handle)
    assert pair.prefill.metric(READS) == reads_p + 1  # P read D's blocks back
    assert pair.prefill.metric(CORRUPT) == 0 and pair.decode.metric(CORRUPT) == 0
    assert handle2["remote_request_id"] != handle["remote_request_id"]
    assert wait_until(lambda: "KV Transfer metrics: Num successful transfers=1" in pair.prefill.log_text())
    line = re.search(r"KV Transfer metrics: .*", pair.prefill.log_text())
    assert line and "Num failed transfers=0, Num KV expired reqs=0" in line.group(0)


def test_edited_history_counts_a_corruption(pair: SimPair) -> None:
    before = pair.prefill.metric(CORRUPT)
    turn1 = list(range(4000, 4200))
    chunks, handle = two_hop(pair, {"prompt": turn1})
    edited = [7, *turn1[1:], *output_ids(chunks), *range(5000, 5050)]
    assert prefill(pair.prefill_url, {"prompt": edited}, {**handle, "do_remote_decode": True}).status_code == 200
    assert pair.prefill.metric(CORRUPT) == before + 1
    assert "pdctl-sim: corrupt KV reuse" in pair.prefill.log_text()


def test_chat_history_is_a_prefix_and_stripped_reasoning_is_not(pair: SimPair) -> None:
    before = pair.prefill.metric(CORRUPT)
    history = [{"role": "user", "content": "tell me about block sizes"}]
    chunks, handle = two_hop(pair, {"messages": history}, chat=True)
    history += [{"role": "assistant", "content": text_of(chunks, chat=True)},
                {"role": "user", "content": "and descriptors?"}]
    chunks, handle = two_hop(pair, {"messages": history}, d_handle=handle, chat=True)
    assert pair.prefill.metric(CORRUPT) == before

    history += [{"role": "assistant", "content": text_of(chunks, chat=True)}, {"role": "user", "content": "why?"}]
    think = {"messages": history, "chat_template_kwargs": {"enable_thinking": True}}
    chunks, handle = two_hop(pair, think, d_handle=handle, chat=True, max_tokens=12)
    answer = text_of(chunks, chat=True)
    assert "<think>" in answer and "</think>" in answer
    stripped = answer.split("</think>", 1)[1]  # what Qwen3's template does to history
    history += [{"role": "assistant", "content": stripped}, {"role": "user", "content": "thanks"}]
    assert prefill(pair.prefill_url, {"messages": history}, {**handle, "do_remote_decode": True},
                   chat=True).status_code == 200
    assert pair.prefill.metric(CORRUPT) == before + 1


def test_handle_is_single_use(pair: SimPair) -> None:
    before = pair.prefill.metric(CORRUPT)
    turn1 = list(range(6000, 6100))
    chunks, handle = two_hop(pair, {"prompt": turn1})
    turn2 = turn1 + output_ids(chunks) + list(range(6200, 6230))
    hit = {**handle, "do_remote_decode": True}
    assert prefill(pair.prefill_url, {"prompt": turn2}, hit).status_code == 200
    assert pair.prefill.metric(CORRUPT) == before
    two_hop(pair, {"prompt": list(range(7000, 7040))})  # D reuses the freed partial block
    again = prefill(pair.prefill_url, {"prompt": turn2}, hit)
    assert again.status_code == 200  # silent, as vLLM
    assert "Potentially invalid KV blocks for unrecognized request " + handle["remote_request_id"] in (
        pair.decode.log_text())
    assert pair.prefill.metric(CORRUPT) == before + 1


def test_unknown_handle_id_is_served_silently(pair: SimPair) -> None:
    turn1 = list(range(8000, 8050))
    chunks, handle = two_hop(pair, {"prompt": turn1})
    forged = {**handle, "do_remote_decode": True, "remote_request_id": "cmpl-nope-0-00000000"}
    assert prefill(pair.prefill_url, {"prompt": turn1 + output_ids(chunks)}, forged).status_code == 200
    assert "unrecognized request cmpl-nope-0-00000000" in pair.decode.log_text()


def test_resending_a_shorter_prompt_reads_misaligned_blocks(pair: SimPair) -> None:
    # vLLM end-trims D's block list to the blocks it needs: with a prompt shorter than D's sequence those are
    # D's last blocks, not its first (reference section 4). The router must only send a hit for a longer prompt.
    before = pair.prefill.metric(CORRUPT)
    turn1 = list(range(10000, 10100))
    _, handle = two_hop(pair, {"prompt": turn1}, max_tokens=40)  # D's sequence spans 9 blocks, the prompt 7
    assert prefill(pair.prefill_url, {"prompt": turn1}, {**handle, "do_remote_decode": True}).status_code == 200
    assert pair.prefill.metric(CORRUPT) == before + 1
