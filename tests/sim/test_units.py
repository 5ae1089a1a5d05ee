"""The pure parts of the simulator: tokenizer, chat template, block pool, time model, config."""

from __future__ import annotations

import asyncio
import json

import pytest

from pdctl.sim import timing
from pdctl.sim.blocks import BlockPool, PoolExhausted
from pdctl.sim.config import ConfigError, parse_args, parse_kv_config
from pdctl.sim.metrics import TransferStats
from pdctl.sim.tokenizer import IM_END, IM_START, THINK_END, THINK_START, decode, encode, generate, render_chat


def test_generated_text_retokenizes_to_the_same_ids() -> None:
    out = generate(list(range(100)), 50, thinking=True)
    assert out[0] == THINK_START and THINK_END in out
    assert encode(decode(out)) == out
    assert generate(list(range(100)), 50) == generate(list(range(100)), 50)
    assert encode("w42 w7\nhello") == [42, 7, encode("hello")[0]]


def test_chat_rendering_of_a_history_is_a_prefix_of_the_longer_one() -> None:
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    turn1 = render_chat(history)
    answer = generate(turn1, 8)
    longer = render_chat([*history, {"role": "assistant", "content": decode(answer)},
                          {"role": "user", "content": [{"type": "text", "text": "more"}]}])
    assert longer[: len(turn1) + len(answer)] == turn1 + answer
    assert longer[len(turn1) + len(answer)] == IM_END and turn1[0] == IM_START
    assert render_chat(history, add_generation_prompt=False) == turn1[:-2]


def test_block_pool_hands_out_blocks_in_vllm_order() -> None:
    pool = BlockPool(num_blocks=20, block_size=4, prefix_caching=False)
    first = pool.allocate(5)
    assert first == [1, 2, 3, 4, 5]
    pool.free_blocks(first)
    second = pool.allocate(8)
    assert second == [5, 4, 3, 2, 1, 6, 7, 8]  # as vLLM 0.26.0 returned on a prefill node
    pool.free_blocks(second)
    assert pool.allocate(8) == [8, 7, 6, 1, 2, 3, 4, 5]
    with pytest.raises(PoolExhausted):
        pool.allocate(13)


def test_prefix_cache_survives_free_until_evicted() -> None:
    pool = BlockPool(num_blocks=4, block_size=4, prefix_caching=True)
    tokens = list(range(10))
    ids = pool.allocate(3)
    pool.write(ids, tokens)
    pool.free_blocks(ids)
    assert pool.usage() == 0
    hit = pool.lookup_prefix([*tokens, 99], max_tokens=10)
    assert hit == ids[:2]  # two full blocks; the partial one is never cached
    assert pool.contents(hit) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    pool.free_blocks(hit)
    pool.allocate(4)  # evicts everything
    assert pool.lookup_prefix(tokens, max_tokens=10) == []


def test_write_keeps_what_a_read_delivered() -> None:
    pool = BlockPool(num_blocks=4, block_size=2, prefix_caching=True)
    ids = pool.allocate(2)
    pool.write(ids, [1, 2, 3, 4], held=[1, 2, 9, 9])
    assert pool.contents(ids) == [[1, 2], [9, 9]]
    pool.free_blocks(ids)
    # hashed by the request's tokens, so a later hit gets the wrong content, as in vLLM
    assert pool.contents(pool.lookup_prefix([1, 2, 3, 4, 5], 5)) == [[1, 2], [9, 9]]


def test_time_model_reproduces_the_off_fit_and_descriptor_costs() -> None:
    n = 16576
    modelled = (timing.prefill_request_ms(n, 0) + timing.decode_first_token_ms(0, n))
    assert abs(modelled - timing.off_fit_ttft_ms(n)) < 0.1 * timing.off_fit_ttft_ms(n)
    assert timing.prefill_compute_ms(512, 24000) > timing.prefill_compute_ms(512, 0)
    assert timing.contiguous_runs([1, 2, 3, 7], [10, 11, 12, 13]) == 2
    assert timing.contiguous_runs([3, 2, 1], [1, 2, 3]) == 3
    six_gb = timing.kv_bytes(24000)
    fragmented = timing.kv_read_ms(six_gb, 94784)
    assert 500 < fragmented < 900  # measured: 6 GB with 94784 descriptors in 720 ms
    assert timing.kv_read_ms(six_gb, 704) < 60  # measured: 29 ms
    b256 = timing.kv_read_ms(timing.kv_bytes(24576), 3504)  # measured at block 256: 6.4 GB, 55 runs in 33.4 ms
    assert 30 < b256 < 36
    assert timing.kv_read_ms(six_gb, 704) < b256 < fragmented
    assert timing.kv_read_ms(0, 0) == 0


def test_wall_time_in_modelled_milliseconds() -> None:
    assert timing.modelled_ms(0.010, 1) == pytest.approx(10.0)
    assert timing.modelled_ms(0.010, 4) == pytest.approx(40.0)  # at speed 4 a wall ms is 4 modelled ones
    assert timing.modelled_ms(0.010, float("inf")) == 0.0


def test_pacer_skips_sleeping_at_infinite_speed() -> None:
    pacer = timing.Pacer(float("inf"))
    assert pacer.scale == 0.0
    asyncio.run(asyncio.wait_for(pacer.wait_ms(1e9), timeout=5))  # would time out if it slept


def test_config_parses_vllm_arguments() -> None:
    kv = ('{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_load_failure_policy":"recompute",'
          '"kv_connector_extra_config":{"bidirectional_kv_xfer":true,"decoder_kv_blocks_ttl":60}}')
    cfg = parse_args(["serve", "m", "--role", "prefill", "--served-model-name", "Qwen", "--no-enable-prefix-caching",
                      "--kv-transfer-config", kv, "--enforce-eager", "--gpu-memory-utilization", "0.85"],
                     env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "5601", "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.2"})
    assert cfg.model_name == "Qwen" and not cfg.prefix_caching
    assert cfg.kv.bidirectional and cfg.kv.recompute_threshold == 64 and cfg.kv.decoder_kv_blocks_ttl == 60
    assert cfg.kv.load_failure_policy == "recompute"
    assert (cfg.side_channel_host, cfg.side_channel_port) == ("10.0.0.2", 5601)
    assert "--enforce-eager" in cfg.ignored_args
    assert parse_kv_config('{"kv_connector":"NixlConnector"}').recompute_threshold == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speed", "0"], "--speed must be > 0"),
        (["--kv-transfer-config", "{oops"], "not valid JSON"),
        (["--kv-transfer-config", '{"kv_load_failure_policy":"retry"}'], "fail or recompute"),
    ],
)
def test_config_errors_say_what_to_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(["serve", "m", "--role", "decode", *argv], env={})


def test_stats_line_has_vllm_keys_in_order() -> None:
    stats = TransferStats()
    stats.add(0.010, 0.001, 2**20 * 4, 64)
    stats.add(0.030, 0.002, 2**20 * 4, 128)
    stats.failed = 1
    assert stats.line() == (
        "KV Transfer metrics: Num successful transfers=2, Avg xfer time (ms)=20.0, P90 xfer time (ms)=30.0, "
        "Avg post time (ms)=1.5, P90 post time (ms)=2.0, Avg MB per transfer=4.0, Throughput (MB/s)=200.0, "
        "Avg number of descriptors=96.0, Num failed transfers=1, Num KV expired reqs=0"
    )


@pytest.mark.parametrize("chat", [False, True])
def test_a_streamed_token_that_is_a_quote_or_a_backslash_stays_valid_json(chat: bool) -> None:
    """The fast path's chunk template takes each token's text escaped: `"` and `\\` are tokens of the vocabulary."""
    from pdctl.sim import protocol
    from pdctl.sim.tokenizer import decode_piece, token_str

    p = protocol.Parsed(chat=chat, model="Qwen", prompt=[1, 2], max_tokens=4, finish_reason="length", stream=True,
                        include_usage=False, return_token_ids=True, kv_params=None, thinking=False)
    line = protocol.middle_template(p, "r1", 0, "Qwen")
    for token in (1014, 1025, 1100):
        assert token_str(token) in ('"', "\\") or token == 1100
        data = json.loads(line.format(piece=protocol.escaped_piece(token), tid=token).removeprefix("data: "))
        choice = data["choices"][0]
        assert (choice["delta"]["content"] if chat else choice["text"]) == decode_piece(token)
