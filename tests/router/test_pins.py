from __future__ import annotations

from pdctl.router.kv.pins import budget_for, kv_capacity, pinned_tokens


def test_a_handle_pins_whole_blocks() -> None:
    assert [pinned_tokens(n, 16) for n in (0, 1, 16, 17, 32)] == [0, 16, 16, 32, 32]
    assert pinned_tokens(-5, 16) == 0


VLLM_METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="256",cache_dtype="auto",engine="0",num_gpu_blocks="896"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen"} 0.0
"""


def test_the_capacity_is_read_from_vllms_cache_config_info() -> None:
    assert kv_capacity(VLLM_METRICS) == 229_376
    assert kv_capacity("vllm:kv_cache_usage_perc 0.5\n") is None
    assert kv_capacity('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n') is None


def test_the_budget_is_fixed_or_a_fraction_of_the_capacity() -> None:
    assert budget_for(1000, 0.5, 229_376) == 1000
    assert budget_for(0, 0.5, 229_376) == 114_688
    assert budget_for(0, 0.5, None) == 0  # the decode does not say: no budget
    assert budget_for(0, 0.0, 229_376) == 0
